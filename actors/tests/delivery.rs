//! Webhook delivery (SPEC §8.3) against a local receiver on `127.0.0.1:0` that verifies the Standard
//! Webhooks signature of every attempt and answers from a script: one signed 2xx, 503 → 503 → 200 retried
//! to success, a permanent 400 never retried, and deadlines that run out while the receiver fails, hangs
//! or is not there.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use storage::RunId;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use actors::delivery::{self, Reply, RetryPolicy};
use serde_json::{json, Value};

const RUN_ID: &str = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
const NOW: i64 = 1_767_225_600;

/// What the receiver does with one request.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Status(u16),
    /// Sleep this long, then 200.
    Hang(Duration),
}

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
struct Seen {
    id: Option<String>,
    timestamp: Option<String>,
    /// The signature checked out against the receiver's copy of the secret.
    verified: bool,
    body: Value,
}

struct Receiver {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    server: actix_web::dev::ServerHandle,
}

impl Receiver {
    /// Answers the n-th request with `script[n]` (the last entry repeats).
    async fn start(script: Vec<Answer>, secret: Option<Vec<u8>>) -> Receiver {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let (record, script, secret) = (seen.clone(), Arc::new(script), Arc::new(secret));
        let server = HttpServer::new(move || {
            let (record, script, secret) = (record.clone(), script.clone(), secret.clone());
            App::new().route(
                "/hook",
                web::post().to(move |req: HttpRequest, bytes: web::Bytes| {
                    let (record, script, secret) = (record.clone(), script.clone(), secret.clone());
                    async move {
                        let header = |n: &str| {
                            req.headers()
                                .get(n)
                                .and_then(|v| v.to_str().ok())
                                .map(str::to_owned)
                        };
                        let (id, timestamp, signature) = (
                            header("webhook-id"),
                            header("webhook-timestamp"),
                            header("webhook-signature"),
                        );
                        let verified = match (secret.as_deref(), &id, &timestamp, &signature) {
                            (Some(key), Some(id), Some(ts), Some(sig)) => ts
                                .parse()
                                .is_ok_and(|ts| delivery::verify(key, id, ts, &bytes, sig)),
                            _ => false,
                        };
                        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                        let n = {
                            let mut seen = record.lock().unwrap();
                            seen.push(Seen {
                                id,
                                timestamp,
                                verified,
                                body,
                            });
                            seen.len() - 1
                        };
                        let answer = script
                            .get(n)
                            .or(script.last())
                            .copied()
                            .unwrap_or(Answer::Status(200));
                        let status = match answer {
                            Answer::Status(s) => s,
                            Answer::Hang(d) => {
                                actix_rt::time::sleep(d).await;
                                200
                            }
                        };
                        HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
                            .body("")
                    }
                }),
            )
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(0)
        .bind(("127.0.0.1", 0))
        .unwrap();
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Receiver {
            url: format!("http://{addr}/hook"),
            seen,
            server: handle,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    async fn stop(self) {
        self.server.stop(false).await;
    }
}

fn body() -> Value {
    json!({"runId": RUN_ID, "threadKey": "t-1", "channel": "c", "user": "u", "status": "completed",
           "answer": "done", "finishedAt": 1_767_225_600_000i64})
}

/// SPEC §8.3's policy with a short first backoff, so a test does not wait seconds between attempts.
fn quick(deadline: Duration) -> RetryPolicy {
    RetryPolicy {
        first_backoff: Duration::from_millis(20),
        ..RetryPolicy::with_deadline(deadline)
    }
}

#[actix_rt::test]
async fn a_signed_delivery_verifies_at_the_receiver() {
    let secret = delivery::webhook_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
    let rx = Receiver::start(vec![Answer::Status(204)], Some(secret.clone())).await;
    let http = reqwest::Client::new();

    let reply = delivery::deliver(
        &http,
        &rx.url,
        Some(&secret),
        Duration::from_secs(30),
        &RunId::from(RUN_ID),
        &body(),
        || NOW,
    )
    .await;

    assert_eq!(reply, (true, None));
    let seen = rx.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].id.as_deref(),
        Some(RUN_ID),
        "webhook-id is the run id"
    );
    assert_eq!(seen[0].timestamp.as_deref(), Some("1767225600"));
    assert!(
        seen[0].verified,
        "the receiver verified the signature: {seen:?}"
    );
    assert_eq!(seen[0].body, body());
    rx.stop().await;
}

#[actix_rt::test]
async fn without_a_secret_nothing_is_signed() {
    let rx = Receiver::start(vec![Answer::Status(200)], Some(b"receiver-key".to_vec())).await;
    let reply = delivery::deliver(
        &reqwest::Client::new(),
        &rx.url,
        None,
        Duration::from_secs(30),
        &RunId::from(RUN_ID),
        &body(),
        || NOW,
    )
    .await;
    assert_eq!(reply, (true, None));
    let seen = rx.seen();
    assert_eq!(
        (
            seen[0].id.as_deref(),
            seen[0].timestamp.as_deref(),
            seen[0].verified
        ),
        (None, None, false)
    );
    rx.stop().await;
}

#[actix_rt::test]
async fn a_503_503_200_sequence_is_delivered_after_two_retries_with_the_same_id_and_body() {
    let secret = b"shared secret".to_vec();
    let rx = Receiver::start(
        vec![
            Answer::Status(503),
            Answer::Status(503),
            Answer::Status(200),
        ],
        Some(secret.clone()),
    )
    .await;
    let clock = std::sync::atomic::AtomicI64::new(NOW);
    let now = || clock.fetch_add(1, std::sync::atomic::Ordering::SeqCst);

    let reply = delivery::deliver_with(
        &reqwest::Client::new(),
        &rx.url,
        Some(&secret),
        quick(Duration::from_secs(10)),
        &RunId::from(RUN_ID),
        &body(),
        now,
    )
    .await;

    assert_eq!(
        reply,
        Reply {
            ok: true,
            note: None,
            attempts: 3,
            withheld: false
        }
    );
    let seen = rx.seen();
    assert_eq!(seen.len(), 3);
    for (i, s) in seen.iter().enumerate() {
        // Each attempt is freshly stamped and signed; the id and the body never change.
        assert!(s.verified, "attempt {i} verified: {s:?}");
        assert_eq!(s.id.as_deref(), Some(RUN_ID));
        assert_eq!(
            s.timestamp.as_deref(),
            Some((NOW + i as i64).to_string().as_str())
        );
        assert_eq!(s.body, body());
    }
    rx.stop().await;
}

#[actix_rt::test]
async fn a_400_is_final_and_not_retried() {
    let rx = Receiver::start(vec![Answer::Status(400), Answer::Status(200)], None).await;
    let reply = delivery::deliver(
        &reqwest::Client::new(),
        &rx.url,
        None,
        Duration::from_secs(30),
        &RunId::from(RUN_ID),
        &body(),
        || NOW,
    )
    .await;
    assert_eq!(reply, (false, Some("webhook answered 400".to_owned())));
    assert_eq!(rx.seen().len(), 1, "a 4xx is the receiver's final word");
    rx.stop().await;
}

#[actix_rt::test]
async fn retries_stop_at_the_deadline_and_the_note_says_so() {
    let rx = Receiver::start(vec![Answer::Status(503)], None).await;
    let deadline = Duration::from_millis(400);
    let started = Instant::now();

    let reply = delivery::deliver_with(
        &reqwest::Client::new(),
        &rx.url,
        None,
        quick(deadline),
        &RunId::from(RUN_ID),
        &body(),
        || NOW,
    )
    .await;

    let took = started.elapsed();
    assert!(!reply.ok);
    let note = reply.note.unwrap_or_default();
    assert!(
        note.starts_with("webhook answered 503") && note.contains("delivery deadline of 400 ms"),
        "{note}"
    );
    assert!(
        reply.attempts >= 2 && reply.attempts as usize == rx.seen().len(),
        "{} attempts, {} seen",
        reply.attempts,
        rx.seen().len()
    );
    assert!(
        took < deadline + Duration::from_millis(300),
        "gave up by the deadline, took {took:?}"
    );
    rx.stop().await;
}

#[actix_rt::test]
async fn an_attempt_that_hangs_is_cut_at_the_deadline() {
    let rx = Receiver::start(vec![Answer::Hang(Duration::from_secs(5))], None).await;
    let started = Instant::now();

    let reply = delivery::deliver_with(
        &reqwest::Client::new(),
        &rx.url,
        None,
        quick(Duration::from_millis(300)),
        &RunId::from(RUN_ID),
        &body(),
        || NOW,
    )
    .await;

    let took = started.elapsed();
    assert!(!reply.ok);
    let note = reply.note.unwrap_or_default();
    assert!(
        note.starts_with("webhook failed: timeout") && note.contains("deadline"),
        "{note}"
    );
    assert!(
        took < Duration::from_millis(1200),
        "the 10 s attempt timeout was cut to the deadline, took {took:?}"
    );
    rx.stop().await;
}

#[actix_rt::test]
async fn a_receiver_that_is_not_there_is_retried_until_the_deadline() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("http://{closed}/hook"); // the listener is dropped: connections are refused

    let reply = delivery::deliver_with(
        &reqwest::Client::new(),
        &url,
        None,
        quick(Duration::from_millis(300)),
        &RunId::from(RUN_ID),
        &body(),
        || NOW,
    )
    .await;

    assert!(!reply.ok);
    assert!(reply.attempts >= 2, "connect errors are retried: {reply:?}");
    let note = reply.note.unwrap_or_default();
    assert!(
        note.starts_with("webhook failed: connection") && note.contains("deadline"),
        "{note}"
    );
}

#[test]
fn a_configured_secret_must_be_set() {
    assert_eq!(delivery::secret_from_env(None), Ok(None));
    let var = "SWITCHBOARD_TEST_DELIVERY_SECRET_UNSET_7f3a";
    assert_eq!(
        delivery::secret_from_env(Some(var)),
        Err(delivery::SecretError::Unset(var.into()))
    );
}

#[actix_rt::test]
async fn a_kill_during_the_retries_withholds_the_next_attempt() {
    let rx = Receiver::start(vec![Answer::Status(503)], None).await;
    let checks = std::cell::Cell::new(0);
    // The run is killed after the first attempt went out.
    let proceed = || {
        checks.set(checks.get() + 1);
        std::future::ready(checks.get() == 1)
    };

    let reply = delivery::deliver_guarded(
        &reqwest::Client::new(),
        &rx.url,
        None,
        quick(Duration::from_secs(10)),
        &RunId::from(RUN_ID),
        &body(),
        || NOW,
        proceed,
    )
    .await;

    assert!(!reply.ok && reply.withheld, "{reply:?}");
    assert_eq!((reply.attempts, rx.seen().len(), checks.get()), (1, 1, 2));
    rx.stop().await;
}
