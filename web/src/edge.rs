//! The edge: the one middleware every request passes, whatever its route (SPEC §8.1).
//!
//! Owns two settings read at boot — whether dev bypass is on, and `public_base_url`'s origin — and
//! nothing else. [`crate::configure`] mounts every route, and the 404 for a path no route has, inside one
//! scope wrapped by [`Edge`], so no route can forget a check.
//!
//! In, before any route (in this order; the first refusal answers):
//! 1. under dev bypass, the `Host` must be loopback (`localhost`, `127.0.0.1`, `[::1]`, any port) or
//!    `public_base_url`'s host, else 403 `forbidden` — reads included;
//! 2. a state-changing request (any method but GET, HEAD, OPTIONS, TRACE) needs `Sec-Fetch-Site` absent,
//!    `same-origin` or `none`, and `Origin` absent or equal to the request's own origin (scheme and
//!    `Host`) or `public_base_url`'s origin, else 403 `forbidden` (`Origin: null` included);
//! 3. a request with a body needs `Content-Type: application/json`, else 415 `unsupported_media_type`
//!    — except on [`SIGNED_FORM_PATHS`] (Slack's interactions), which also take
//!    `application/x-www-form-urlencoded`: Slack posts its button clicks as a form, and that route does
//!    nothing for a body its HMAC signature does not cover (a cross-site form cannot sign).
//!
//! Out, on every answer:
//! - no `Access-Control-*` header (no CORS, ever: a browser then keeps cross-origin pages from reading
//!   any answer, and from sending anything that needs a preflight);
//! - `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer` (capability tokens are in URLs);
//!   HTML answers also carry [`crate::routes::html::content_security_policy`];
//! - an error that is neither JSON nor an HTML page (actix's own answers: an extractor's 413, a bare 405
//!   or 404) is rewritten to `{error, message}` with the same status and headers;
//! - one access line: method, route pattern, status, latency (at info for a 4xx or 5xx, else debug); the
//!   same latency (until the response
//!   head: an SSE stream counts until it starts) goes to `switchboard_http_request_duration_seconds` by
//!   route pattern and status class.
//!
//! # Design
//! The threat is the operator's own browser. Dev bypass trusts a loopback peer, and any page the operator
//! opens can make the browser send requests to loopback. Without a preflight, a cross-site page can send
//! a POST whose body is `text/plain` or a form — never `application/json` — so requiring that type for
//! bodies, and refusing what `Sec-Fetch-Site` and `Origin` (which a page cannot forge) mark as
//! cross-site, stops it. A DNS-rebinding page is different: its own host name now resolves to
//! 127.0.0.1, so to the browser its requests are same-origin and carry its `Origin` and a matching
//! `Host` — but that `Host` is its name, not one this process serves, hence check 1. The raw `Host`
//! header is read, never `X-Forwarded-Host` (a same-origin page may set that one freely).

use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use actors::metrics::Metrics;

use actix_web::body::BoxBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use actix_web::http::Method;
use actix_web::HttpRequest;
use futures_util::future::{ready, LocalBoxFuture, Ready};

use crate::error::{code_for_status, ApiError};
use crate::routes::html::content_security_policy;

/// Paths whose bodies may also be `application/x-www-form-urlencoded`: routes that act only on a body
/// signed with a secret the sender shares (SPEC §12), so a form a cross-site page posts forges nothing.
pub const SIGNED_FORM_PATHS: [&str; 1] = [crate::routes::slack::INTERACTIONS_PATH];

/// Host names that are this machine whatever the port.
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];
/// The longest header value an error message quotes.
const QUOTE_MAX: usize = 80;

/// An origin: lowercased scheme and host, and the port (defaulted from the scheme).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl Origin {
    /// `scheme://host[:port]` (an `Origin` header); a path after it is ignored (`public_base_url`).
    /// `None` for anything else (`null`, another scheme, user info).
    pub fn parse(s: &str) -> Option<Origin> {
        let (scheme, rest) = s.trim().split_once("://")?;
        let scheme = scheme.to_ascii_lowercase();
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        if authority.contains('@') {
            return None;
        }
        Origin::from_host(&scheme, authority)
    }

    /// The origin a request for `host` (a `Host` value) over `scheme` has.
    fn from_host(scheme: &str, host: &str) -> Option<Origin> {
        let default = match scheme {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        let (host, port) = split_host(host)?;
        Some(Origin {
            scheme: scheme.to_owned(),
            host,
            port: port.unwrap_or(default),
        })
    }
}

/// A `Host` value (`name`, `name:port`, `[v6]`, `[v6]:port`) as its lowercased host and its port;
/// `None` when it is none of these.
pub fn split_host(value: &str) -> Option<(String, Option<u16>)> {
    let value = value.trim();
    let (host, port) = if value.starts_with('[') {
        let end = value.find(']')?;
        let (host, rest) = value.split_at(end + 1);
        match rest {
            "" => (host, None),
            _ => (host, Some(rest.strip_prefix(':')?)),
        }
    } else {
        match value.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (value, None),
        }
    };
    if host.is_empty() || (!host.starts_with('[') && host.contains(':')) {
        return None;
    }
    let port = match port {
        None => None,
        Some(p) => Some(p.parse::<u16>().ok()?),
    };
    Some((host.to_ascii_lowercase(), port))
}

/// The checks, with what they compare against.
#[derive(Debug, Clone)]
pub struct Checks {
    dev_bypass: bool,
    /// `public_base_url`'s origin (`None` if it does not parse, which config validation prevents).
    public: Option<Origin>,
}

impl Checks {
    pub fn new(dev_bypass: bool, public_base_url: &str) -> Self {
        Checks {
            dev_bypass,
            public: Origin::parse(public_base_url),
        }
    }

    /// The refusal for `req`, if any (SPEC §8.1, cross-site protection; the order is the module's).
    pub fn check(&self, req: &HttpRequest) -> Result<(), ApiError> {
        let headers = req.headers();
        let host = request_host(req);
        if self.dev_bypass && !host.as_deref().is_some_and(|h| self.served_host(h)) {
            return Err(ApiError::Refused(format!(
                "host {} is not served here: with dev bypass on, use a loopback host or public_base_url's",
                quote(host.as_deref().unwrap_or("(none)"))
            )));
        }
        if !matches!(
            *req.method(),
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        ) {
            if let Some(site) = headers.get("sec-fetch-site") {
                let ok = site.to_str().is_ok_and(|s| {
                    s.eq_ignore_ascii_case("same-origin") || s.eq_ignore_ascii_case("none")
                });
                if !ok {
                    let site = quote(site.to_str().unwrap_or("?"));
                    return Err(ApiError::Refused(format!(
                        "cross-site request refused (Sec-Fetch-Site: {site})"
                    )));
                }
            }
            if let Some(origin) = headers.get(header::ORIGIN) {
                let parsed = origin.to_str().ok().and_then(Origin::parse);
                let scheme = if req.app_config().secure() {
                    "https"
                } else {
                    "http"
                };
                let own = host.as_deref().and_then(|h| Origin::from_host(scheme, h));
                let ok = parsed
                    .is_some_and(|o| own.as_ref() == Some(&o) || self.public.as_ref() == Some(&o));
                if !ok {
                    let origin = quote(origin.to_str().unwrap_or("?"));
                    return Err(ApiError::Refused(format!(
                        "cross-site request refused (Origin: {origin})"
                    )));
                }
            }
        }
        let signed_form = is_form(headers) && SIGNED_FORM_PATHS.contains(&req.path());
        if has_body(headers) && !is_json(headers) && !signed_form {
            return Err(ApiError::UnsupportedMediaType(
                "a request body must be Content-Type: application/json".into(),
            ));
        }
        Ok(())
    }

    /// Loopback, or `public_base_url`'s host (any port).
    fn served_host(&self, value: &str) -> bool {
        split_host(value).is_some_and(|(host, _)| {
            LOOPBACK_HOSTS.contains(&host.as_str())
                || self.public.as_ref().is_some_and(|p| p.host == host)
        })
    }
}

/// The request's `Host` header (HTTP/1.1), else the URI's authority (HTTP/2). Never a forwarded host.
fn request_host(req: &HttpRequest) -> Option<String> {
    match req.headers().get(header::HOST) {
        Some(v) => v.to_str().ok().map(str::to_owned),
        None => req.uri().authority().map(|a| a.as_str().to_owned()),
    }
}

/// Whether the request carries a body: a non-zero (or unreadable) `Content-Length`, or chunked.
fn has_body(headers: &HeaderMap) -> bool {
    let length = headers
        .get(header::CONTENT_LENGTH)
        .map(|v| v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()));
    match length {
        Some(Some(0)) => false,
        Some(_) => true,
        None => headers.contains_key(header::TRANSFER_ENCODING),
    }
}

/// `Content-Type: application/json`, parameters (`; charset=utf-8`) allowed.
fn is_json(headers: &HeaderMap) -> bool {
    essence(headers).is_some_and(|e| e.eq_ignore_ascii_case("application/json"))
}

/// `Content-Type: application/x-www-form-urlencoded`, parameters allowed.
fn is_form(headers: &HeaderMap) -> bool {
    essence(headers).is_some_and(|e| e.eq_ignore_ascii_case("application/x-www-form-urlencoded"))
}

/// A `Content-Type`'s media type without parameters.
fn essence(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(v.split(';').next().unwrap_or("").trim())
}

/// A header value fit to quote in a message: cut to [`QUOTE_MAX`] characters.
fn quote(s: &str) -> String {
    s.chars().take(QUOTE_MAX).collect()
}

/// The outgoing half: CORS headers stripped, security headers added, a non-JSON error made JSON.
pub fn finish(res: ServiceResponse) -> ServiceResponse {
    let mut res = res;
    let headers = res.headers_mut();
    let cors: Vec<HeaderName> = headers
        .keys()
        .filter(|k| k.as_str().starts_with("access-control-"))
        .cloned()
        .collect();
    for name in cors {
        headers.remove(name);
    }
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    let kind = essence(headers).map(str::to_ascii_lowercase);
    if kind.as_deref() == Some("text/html") {
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(content_security_policy()),
        );
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    let status = res.status();
    let shaped = matches!(kind.as_deref(), Some("application/json" | "text/html"));
    if status.as_u16() < 400 || shaped {
        return res;
    }
    let (error, message) = code_for_status(status);
    let body = serde_json::json!({"error": error, "message": message}).to_string();
    res.map_body(|head, _| {
        head.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        BoxBody::new(body)
    })
}

/// The middleware (an actix [`Transform`]): [`Checks`] in, [`finish`] out.
#[derive(Clone)]
pub struct Edge {
    checks: Rc<Checks>,
    metrics: Arc<Metrics>,
}

impl Edge {
    pub fn new(checks: Checks, metrics: Arc<Metrics>) -> Self {
        Edge {
            checks: Rc::new(checks),
            metrics,
        }
    }
}

impl<S> Transform<S, ServiceRequest> for Edge
where
    S: Service<ServiceRequest, Response = ServiceResponse<BoxBody>, Error = actix_web::Error>
        + 'static,
    S::Future: 'static,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = actix_web::Error;
    type Transform = EdgeService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, ()>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(EdgeService {
            service,
            checks: self.checks.clone(),
            metrics: self.metrics.clone(),
        }))
    }
}

pub struct EdgeService<S> {
    service: S,
    checks: Rc<Checks>,
    metrics: Arc<Metrics>,
}

impl<S> Service<ServiceRequest> for EdgeService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<BoxBody>, Error = actix_web::Error>
        + 'static,
    S::Future: 'static,
{
    type Response = ServiceResponse<BoxBody>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    actix_web::dev::forward_ready!(service);

    fn call(&self, req: ServiceRequest) -> Self::Future {
        let started = Instant::now();
        // No `HttpRequest` clone may live across the inner call: routing needs the only reference.
        if let Err(refusal) = self.checks.check(req.request()) {
            tracing::debug!(method = %req.method(), error = %refusal, "refused at the edge");
            let res = finish(req.error_response(refusal));
            log(&res, started, &self.metrics);
            return Box::pin(ready(Ok(res)));
        }
        let fut = self.service.call(req);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            // Routes answer their own errors; an `Err` here is actix's, and it renders it.
            let res = finish(fut.await?);
            log(&res, started, &metrics);
            Ok(res)
        })
    }
}

/// The per-request access line (method, route pattern, status, latency; the error code of a refusal) and
/// its latency histogram: at info for a 4xx or 5xx, so an operator sees every refusal without debug
/// logging, and at debug otherwise. The path's own values (ids, tokens) are never logged: the pattern is.
fn log(res: &ServiceResponse, started: Instant, metrics: &Metrics) {
    let took = started.elapsed();
    // Every resource carries its pattern ([`crate::routes::resource`]); none is a path no route has.
    let route = res
        .request()
        .app_data::<crate::routes::RoutePattern>()
        .map(|pattern| pattern.0.as_str());
    let status = res.status().as_u16();
    metrics.http_request(route, status, took);
    let (method, route, latency_ms) = (
        res.request().method(),
        route.unwrap_or("unmatched"),
        took.as_secs_f64() * 1e3,
    );
    if status >= 400 {
        let (error, _) = code_for_status(res.status());
        tracing::info!(%method, route, status, error, latency_ms, "request refused or failed");
    } else {
        tracing::debug!(%method, route, status, latency_ms, "request");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;
    use actix_web::ResponseError;

    fn checks(dev_bypass: bool) -> Checks {
        Checks::new(dev_bypass, "https://switchboard.example.com/base")
    }

    /// The refusal's code for a request built by `f`, or `None` when it passes.
    fn refusal(c: &Checks, f: impl FnOnce(TestRequest) -> TestRequest) -> Option<u16> {
        let req = f(TestRequest::default().insert_header((header::HOST, "127.0.0.1:8080")))
            .to_http_request();
        c.check(&req).err().map(|e| e.status_code().as_u16())
    }

    #[test]
    fn hosts_and_origins_parse_with_default_ports_and_case_folded() {
        assert_eq!(
            split_host("LocalHost:9000"),
            Some(("localhost".into(), Some(9000)))
        );
        assert_eq!(split_host("[::1]:8080"), Some(("[::1]".into(), Some(8080))));
        assert_eq!(split_host("[::1]"), Some(("[::1]".into(), None)));
        for bad in ["", ":80", "a:b", "::1", "[::1", "[::1]x", "host:"] {
            assert_eq!(split_host(bad), None, "{bad:?}");
        }
        assert_eq!(
            Origin::parse("HTTP://Example.com"),
            Origin::parse("http://example.com:80/x")
        );
        assert_ne!(
            Origin::parse("https://example.com"),
            Origin::parse("http://example.com")
        );
        for bad in ["null", "file://", "ftp://x", "http://u@x", "example.com"] {
            assert_eq!(Origin::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn state_changing_requests_from_another_site_are_refused_and_same_origin_ones_pass() {
        let c = checks(false);
        let post = |r: TestRequest| r.method(Method::POST);
        assert_eq!(
            refusal(&c, post),
            None,
            "no browser headers: a server-side client"
        );
        assert_eq!(
            refusal(&c, |r| post(r)
                .insert_header(("sec-fetch-site", "same-origin"))),
            None
        );
        assert_eq!(
            refusal(&c, |r| post(r).insert_header(("sec-fetch-site", "none"))),
            None
        );
        assert_eq!(
            refusal(&c, |r| post(r)
                .insert_header(("sec-fetch-site", "same-site"))),
            Some(403)
        );
        assert_eq!(
            refusal(&c, |r| post(r)
                .insert_header(("sec-fetch-site", "cross-site"))),
            Some(403)
        );
        // Origin: its own (scheme + Host), public_base_url's, or nothing else.
        assert_eq!(
            refusal(&c, |r| post(r)
                .insert_header((header::ORIGIN, "http://127.0.0.1:8080"))),
            None
        );
        assert_eq!(
            refusal(&c, |r| post(r).insert_header((
                header::ORIGIN,
                "https://switchboard.example.com"
            ))),
            None
        );
        for other in [
            "http://127.0.0.1:8081",
            "https://127.0.0.1:8080",
            "http://evil.example",
            "null",
            "",
        ] {
            assert_eq!(
                refusal(&c, |r| post(r).insert_header((header::ORIGIN, other))),
                Some(403),
                "{other:?}"
            );
        }
        // DELETE and PUT are state-changing too; a read is not checked for origin.
        assert_eq!(
            refusal(&c, |r| r
                .method(Method::DELETE)
                .insert_header((header::ORIGIN, "null"))),
            Some(403)
        );
        assert_eq!(
            refusal(&c, |r| r
                .method(Method::PUT)
                .insert_header(("sec-fetch-site", "cross-site"))),
            Some(403)
        );
        assert_eq!(
            refusal(&c, |r| r
                .insert_header(("sec-fetch-site", "cross-site"))
                .insert_header((header::ORIGIN, "null"))),
            None
        );
    }

    #[test]
    fn a_body_must_be_json_and_cross_site_is_decided_first() {
        let c = checks(false);
        let body = |r: TestRequest, ct: &'static str| {
            r.method(Method::POST)
                .insert_header((header::CONTENT_TYPE, ct))
                .set_payload("{}")
        };
        assert_eq!(refusal(&c, |r| body(r, "application/json")), None);
        assert_eq!(
            refusal(&c, |r| body(r, "Application/JSON; charset=utf-8")),
            None
        );
        for ct in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonp",
        ] {
            assert_eq!(refusal(&c, |r| body(r, ct)), Some(415), "{ct}");
        }
        assert_eq!(
            refusal(&c, |r| r.method(Method::POST).set_payload("{}")),
            Some(415),
            "no content type"
        );
        assert_eq!(
            refusal(&c, |r| r
                .method(Method::POST)
                .insert_header((header::CONTENT_LENGTH, "0"))),
            None,
            "empty body"
        );
        assert_eq!(
            refusal(&c, |r| body(r, "text/plain")
                .insert_header(("sec-fetch-site", "cross-site"))),
            Some(403)
        );
    }

    #[test]
    fn a_form_body_passes_only_on_a_signed_form_path() {
        let c = checks(false);
        let form = |path: &'static str, ct: &'static str| {
            move |r: TestRequest| {
                r.method(Method::POST)
                    .uri(path)
                    .insert_header((header::CONTENT_TYPE, ct))
                    .set_payload("payload=%7B%7D")
            }
        };
        let form_type = "application/x-www-form-urlencoded";
        // Slack's button clicks: a form, no Origin, no Sec-Fetch-Site.
        assert_eq!(refusal(&c, form("/slack/interactions", form_type)), None);
        assert_eq!(
            refusal(
                &c,
                form(
                    "/slack/interactions",
                    "Application/X-WWW-Form-Urlencoded; charset=utf-8"
                )
            ),
            None
        );
        // Its other types, and a form anywhere else, stay refused.
        assert_eq!(
            refusal(&c, form("/slack/interactions", "text/plain")),
            Some(415)
        );
        for path in [
            "/slack/events",
            "/api/messages",
            "/slack/interactions/x",
            "/",
        ] {
            assert_eq!(refusal(&c, form(path, form_type)), Some(415), "{path}");
        }
        // Slack's events are JSON and pass like any JSON body.
        assert_eq!(refusal(&c, form("/slack/events", "application/json")), None);
        // A browser's cross-site form is still refused before its type is considered.
        assert_eq!(
            refusal(&c, |r| form("/slack/interactions", form_type)(r)
                .insert_header(("sec-fetch-site", "cross-site"))),
            Some(403)
        );
    }

    #[test]
    fn under_dev_bypass_every_request_needs_a_served_host() {
        let c = checks(true);
        let host = |h: &'static str| move |r: TestRequest| r.insert_header((header::HOST, h));
        for ok in [
            "127.0.0.1:8080",
            "localhost",
            "LOCALHOST:1",
            "[::1]:9",
            "switchboard.example.com",
            "switchboard.example.com:8443",
        ] {
            assert_eq!(refusal(&c, host(ok)), None, "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.2",
            "localhost.evil.example",
            "",
            "[::2]:80",
        ] {
            assert_eq!(refusal(&c, host(bad)), Some(403), "{bad:?}");
        }
        // Without dev bypass, a Host is not checked (a bearer token is the credential then).
        assert_eq!(refusal(&checks(false), host("evil.example")), None);
    }
}
