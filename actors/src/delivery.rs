//! Webhook delivery (SPEC §8.3): POST a finished run's reply to `delivery.webhook_url`, signed, and
//! retried until a deadline.
//!
//! Owns nothing durable and no task: [`deliver`] is one future the run shell awaits after the finishing
//! gate; what it answers becomes the record's `replyOk` / `replyNote`. It also owns the Standard Webhooks
//! signature ([`sign`], [`signature_headers`], [`verify`]), which the HTTP tools send too.
//!
//! Who calls it: the run shell's reply step (`run::work`), with the body
//! `{runId, threadKey, channel, user, status, answer, finishedAt}`; boot reads the secret once with
//! [`secret_from_env`].
//!
//! Invariants:
//! - one body, serialized once: every attempt sends the same bytes under the same `webhook-id` (the run
//!   id), so a receiver can deduplicate retries by id; only `webhook-timestamp` (and so the signature)
//!   is fresh per attempt;
//! - retried: connect errors, timeouts, and 5xx answers; never retried: any other answer (a 4xx is the
//!   receiver's final word), a request that cannot be built;
//! - bounded: no attempt outlives the deadline (an attempt's timeout is the smaller of
//!   [`ATTEMPT_TIMEOUT`] and the time left), and no backoff sleep starts that would end past it, so
//!   `deliver` returns within `deadline` plus scheduling noise;
//! - never logs the body or the secret.
//!
//! | an attempt answers          | then                                       | `replyOk`, `replyNote`                |
//! |-----------------------------|--------------------------------------------|---------------------------------------|
//! | 2xx                         | done                                       | `true`, none                          |
//! | 4xx, any other non-5xx      | done                                       | `false`, `webhook answered 400`       |
//! | 5xx, connect error, timeout | back off, retry while the deadline allows  | at the deadline: `false`, the last failure and `(gave up after 3 attempts: delivery deadline of 30000 ms)` |

use std::time::Duration;
use storage::RunId;

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

/// How long one attempt may take (SPEC §8.3: "a 10 s timeout").
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// The wait before the first retry; it doubles after each retry, each wait jittered by ±50 %.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// `delivery.deadline_ms` when the config does not say.
pub const DEFAULT_DEADLINE: Duration = Duration::from_millis(30_000);

/// Standard Webhooks header names.
pub const HEADER_ID: &str = "webhook-id";
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
pub const HEADER_SIGNATURE: &str = "webhook-signature";

/// The prefix of a Standard Webhooks secret whose rest is base64 (`whsec_<base64>`).
const SECRET_PREFIX: &str = "whsec_";

/// When to retry and for how long. [`RetryPolicy::with_deadline`] is SPEC §8.3's policy; tests shorten
/// the backoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The timeout of one attempt (cut to the time left before the deadline).
    pub attempt_timeout: Duration,
    /// The (unjittered) wait before the first retry; doubles per retry.
    pub first_backoff: Duration,
    /// From the first attempt: no attempt or wait extends past it.
    pub deadline: Duration,
}

impl RetryPolicy {
    /// [`ATTEMPT_TIMEOUT`], [`FIRST_BACKOFF`], and `deadline` (`delivery.deadline_ms`).
    pub fn with_deadline(deadline: Duration) -> Self {
        RetryPolicy {
            attempt_timeout: ATTEMPT_TIMEOUT,
            first_backoff: FIRST_BACKOFF,
            deadline,
        }
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy::with_deadline(DEFAULT_DEADLINE)
    }
}

/// Where and how replies are delivered (`[delivery]`): the URL, the signing secret, the deadline.
#[derive(Debug, Clone)]
pub struct Webhook {
    pub url: String,
    pub secret: Option<Vec<u8>>,
    pub deadline: Duration,
}

/// What a delivery came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// `replyOk`: an attempt was answered 2xx.
    pub ok: bool,
    /// `replyNote`: why not (`None` when `ok`).
    pub note: Option<String>,
    /// How many POSTs went out.
    pub attempts: u32,
    /// [`deliver_guarded`]'s guard said no before an attempt (the run was killed meanwhile): nothing
    /// more was sent. The shell treats it as its kill path (no record), not as a failed reply.
    pub withheld: bool,
}

impl Reply {
    /// `(replyOk, replyNote)`.
    pub fn into_pair(self) -> (bool, Option<String>) {
        (self.ok, self.note)
    }
}

/// Why a configured secret could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("environment variable {0} (delivery.secret_env) is not set or empty")]
    Unset(String),
    #[error("environment variable {var} (delivery.secret_env) holds a `whsec_` secret that is not base64: {why}")]
    BadBase64 { var: String, why: String },
}

/// The signing key a secret string stands for: a Standard Webhooks `whsec_<base64>` secret is the
/// decoded bytes (what the Standard Webhooks libraries verify with); any other string is its own bytes.
pub fn webhook_secret(value: &str) -> Result<Vec<u8>, base64::DecodeError> {
    match value.strip_prefix(SECRET_PREFIX) {
        Some(b64) => base64::engine::general_purpose::STANDARD.decode(b64.trim()),
        None => Ok(value.as_bytes().to_vec()),
    }
}

/// The signing key named by `delivery.secret_env`: `Ok(None)` when no variable is configured, an error
/// when one is configured but unset or empty (sending unsigned when the operator asked for signatures
/// would be a silent downgrade, so boot refuses instead).
pub fn secret_from_env(var: Option<&str>) -> Result<Option<Vec<u8>>, SecretError> {
    let Some(var) = var.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let value = std::env::var(var).unwrap_or_default();
    if value.is_empty() {
        return Err(SecretError::Unset(var.to_owned()));
    }
    webhook_secret(&value)
        .map(Some)
        .map_err(|e| SecretError::BadBase64 {
            var: var.to_owned(),
            why: e.to_string(),
        })
}

/// `v1,<base64 HMAC-SHA256 of "id.timestamp.body">`: the `webhook-signature` value.
pub fn sign(secret: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

/// The three Standard Webhooks headers for one attempt: `webhook-id`, `webhook-timestamp` (unix
/// seconds) and `webhook-signature`.
pub fn signature_headers(
    secret: &[u8],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> [(&'static str, String); 3] {
    [
        (HEADER_ID, id.to_owned()),
        (HEADER_TIMESTAMP, timestamp.to_string()),
        (HEADER_SIGNATURE, sign(secret, id, timestamp, body)),
    ]
}

/// Whether `signature_header` (space-separated `v1,<base64>` entries, as Standard Webhooks allows
/// several) holds a valid signature of `id.timestamp.body`. The comparison is constant-time. For
/// receivers and tests; checking the timestamp's age is the receiver's policy.
pub fn verify(
    secret: &[u8],
    id: &str,
    timestamp: i64,
    body: &[u8],
    signature_header: &str,
) -> bool {
    signature_header
        .split_whitespace()
        .filter_map(|s| s.strip_prefix("v1,"))
        .any(|b64| {
            let Ok(given) = base64::engine::general_purpose::STANDARD.decode(b64) else {
                return false;
            };
            let mut mac =
                Hmac::<Sha256>::new_from_slice(secret).expect("HMAC accepts keys of any length");
            mac.update(id.as_bytes());
            mac.update(b".");
            mac.update(timestamp.to_string().as_bytes());
            mac.update(b".");
            mac.update(body);
            mac.verify_slice(&given).is_ok()
        })
}

/// Unix seconds now, for [`deliver`]'s `now_secs`.
pub fn unix_now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// POST `body` to `url` per SPEC §8.3 and answer `(replyOk, replyNote)`: a 10 s timeout per attempt,
/// signed with `webhook-id` = `run_id` when `secret` is set, retried on connect errors, timeouts and 5xx
/// with backoff (0.5 s doubling, ±50 % jitter) until `deadline`. `now_secs` stamps `webhook-timestamp`.
pub async fn deliver(
    http: &reqwest::Client,
    url: &str,
    secret: Option<&[u8]>,
    deadline: Duration,
    run_id: &RunId,
    body: &Value,
    now_secs: impl Fn() -> i64,
) -> (bool, Option<String>) {
    deliver_with(
        http,
        url,
        secret,
        RetryPolicy::with_deadline(deadline),
        run_id,
        body,
        now_secs,
    )
    .await
    .into_pair()
}

/// What one attempt came to.
enum Attempt {
    /// Final: `replyOk`, `replyNote`.
    Done { ok: bool, note: Option<String> },
    /// Worth retrying; the note if it was the last.
    Retry(String),
}

/// [`deliver`] with an explicit [`RetryPolicy`], answering the whole [`Reply`].
pub async fn deliver_with(
    http: &reqwest::Client,
    url: &str,
    secret: Option<&[u8]>,
    policy: RetryPolicy,
    run_id: &RunId,
    body: &Value,
    now_secs: impl Fn() -> i64,
) -> Reply {
    deliver_guarded(http, url, secret, policy, run_id, body, now_secs, || {
        std::future::ready(true)
    })
    .await
}

/// [`deliver_with`], asking `proceed` immediately before every attempt, retries included: the run
/// shell's kill check (SPEC §5.2 step 7: a killed run sends nothing), so a kill that lands during the
/// retries stops them. `false` ends the delivery with [`Reply::withheld`].
#[allow(clippy::too_many_arguments)]
pub async fn deliver_guarded<G, F>(
    http: &reqwest::Client,
    url: &str,
    secret: Option<&[u8]>,
    policy: RetryPolicy,
    run_id: &RunId,
    body: &Value,
    now_secs: impl Fn() -> i64,
    mut proceed: G,
) -> Reply
where
    G: FnMut() -> F,
    F: std::future::Future<Output = bool>,
{
    // tokio's clock, so a paused-time test drives the backoff.
    let started = tokio::time::Instant::now();
    let bytes = match serde_json::to_vec(body) {
        Ok(b) => b,
        Err(e) => {
            return Reply {
                ok: false,
                note: Some(format!("webhook body cannot be serialized: {e}")),
                attempts: 0,
                withheld: false,
            }
        }
    };
    let deadline_ms = policy.deadline.as_millis();
    let mut backoff = policy.first_backoff;
    let mut attempts = 0u32;
    // Why the last attempt failed, once one did.
    let mut failed: Option<String> = None;
    let gave_up = |why: &str, attempts: u32| {
        tracing::info!(
            %run_id,
            attempts,
            deadline_ms = deadline_ms as u64,
            "webhook delivery gave up: {why}"
        );
        let s = if attempts == 1 { "" } else { "s" };
        Reply {
            ok: false,
            note: Some(format!("{why} (gave up after {attempts} attempt{s}: delivery deadline of {deadline_ms} ms)")),
            attempts,
            withheld: false,
        }
    };
    loop {
        let left = policy.deadline.saturating_sub(started.elapsed());
        let timeout = policy.attempt_timeout.min(left);
        if timeout.is_zero() {
            // No wait is started that would end past the deadline, but a busy machine may wake one
            // late: the last failure is still what the reply tells.
            if let Some(why) = &failed {
                return gave_up(why, attempts);
            }
            return Reply {
                ok: false,
                note: Some(format!(
                    "webhook not sent: delivery deadline of {deadline_ms} ms"
                )),
                attempts,
                withheld: false,
            };
        }
        if !proceed().await {
            tracing::info!(
                %run_id,
                attempts,
                "webhook delivery withheld before an attempt"
            );
            return Reply {
                ok: false,
                note: Some("webhook withheld: the run was stopped".into()),
                attempts,
                withheld: true,
            };
        }
        attempts += 1;
        let mut request = http
            .post(url)
            .timeout(timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(bytes.clone());
        if let Some(secret) = secret {
            for (name, value) in signature_headers(secret, run_id, now_secs(), &bytes) {
                request = request.header(name, value);
            }
        }
        let why = match attempt(request).await {
            Attempt::Done { ok, note } => {
                return Reply {
                    ok,
                    note,
                    attempts,
                    withheld: false,
                }
            }
            Attempt::Retry(why) => why,
        };
        let wait = jittered(backoff);
        backoff = backoff.saturating_mul(2);
        if started.elapsed() + wait >= policy.deadline {
            return gave_up(&why, attempts);
        }
        tracing::debug!(
            %run_id,
            attempts,
            wait_ms = wait.as_millis() as u64,
            "webhook delivery will retry: {why}"
        );
        failed = Some(why);
        tokio::time::sleep(wait).await;
    }
}

/// Send one attempt and classify its answer.
async fn attempt(request: reqwest::RequestBuilder) -> Attempt {
    let done = |ok: bool, note: Option<String>| Attempt::Done { ok, note };
    match request.send().await {
        Ok(r) if r.status().is_success() => done(true, None),
        Ok(r) if r.status().is_server_error() => {
            Attempt::Retry(format!("webhook answered {}", r.status().as_u16()))
        }
        Ok(r) => done(
            false,
            Some(format!("webhook answered {}", r.status().as_u16())),
        ),
        Err(e) if e.is_timeout() => Attempt::Retry("webhook failed: timeout".into()),
        // A request that cannot be built (a bad URL or header) or a redirect loop fails the same way again.
        Err(e) if e.is_builder() => done(false, Some("webhook failed: bad request".into())),
        Err(e) if e.is_redirect() => done(false, Some("webhook failed: redirect".into())),
        // Connect errors, and a connection lost before the answer.
        Err(_) => Attempt::Retry("webhook failed: connection".into()),
    }
}

/// `base` times a uniform factor in [0.5, 1.5].
fn jittered(base: Duration) -> Duration {
    base.mul_f64(storage::entropy::between(0.5, 1.5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_id_dot_timestamp_dot_body() {
        // The Standard Webhooks reference vector (secret `whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw`).
        let secret = webhook_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        let sig = sign(&secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body);
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        assert!(verify(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            body,
            &format!("v1,bogus {sig}")
        ));
        // Any change to the id, the timestamp or the body breaks it.
        assert!(!verify(&secret, "msg_other", 1614265330, body, &sig));
        assert!(!verify(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265331,
            body,
            &sig
        ));
        assert!(!verify(
            &secret,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            b"{}",
            &sig
        ));
        assert!(!verify(
            b"other",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            body,
            &sig
        ));
    }

    #[test]
    fn a_secret_without_the_whsec_prefix_is_its_own_bytes() {
        assert_eq!(webhook_secret("plain secret").unwrap(), b"plain secret");
        assert!(webhook_secret("whsec_!!!").is_err());
    }

    #[test]
    fn headers_carry_the_id_and_timestamp_they_sign() {
        let [(n1, id), (n2, ts), (n3, sig)] = signature_headers(b"k", "run-1", 42, b"{}");
        assert_eq!(
            (n1, n2, n3),
            ("webhook-id", "webhook-timestamp", "webhook-signature")
        );
        assert_eq!((id.as_str(), ts.as_str()), ("run-1", "42"));
        assert!(verify(b"k", "run-1", 42, b"{}", &sig));
    }

    #[test]
    fn jitter_stays_within_half_either_side() {
        for _ in 0..200 {
            let d = jittered(Duration::from_millis(500));
            assert!(
                d >= Duration::from_millis(250) && d <= Duration::from_millis(750),
                "{d:?}"
            );
        }
    }
}
