//! Who is calling: bearer tokens from config, the loopback dev bypass, and run capability tokens.
//!
//! A [`Principal`] carries its scopes and its visibility filter. With `dev_bypass`, a request from a
//! loopback address is the operator (every scope, visibility `all`). Tokens are compared in constant
//! time; the token values come from environment variables named in config, never from the file.

use actix_web::HttpRequest;
use storage::record::VisibilityFilter;

use crate::error::ApiError;

pub const RUNS_READ: &str = "runs:read";
pub const RUNS_WRITE: &str = "runs:write";
pub const RUNS_KILL: &str = "runs:kill";
pub const MESSAGES_WRITE: &str = "messages:write";
pub const DEPLOY_WRITE: &str = "deploy:write";

/// A configured bearer token.
#[derive(Debug, Clone)]
pub struct TokenGrant {
    pub name: String,
    pub token: String,
    pub scopes: Vec<String>,
    pub visible_to: VisibilityFilter,
}

#[derive(Debug, Clone, Default)]
pub struct AuthConfig {
    pub dev_bypass: bool,
    pub tokens: Vec<TokenGrant>,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    /// The token's name (`operator` for the dev bypass); scopes idempotency keys.
    pub name: String,
    pub scopes: Vec<String>,
    pub visible_to: VisibilityFilter,
}

impl Principal {
    pub fn operator() -> Self {
        Principal {
            name: "operator".into(),
            scopes: [
                RUNS_READ,
                RUNS_WRITE,
                RUNS_KILL,
                MESSAGES_WRITE,
                DEPLOY_WRITE,
            ]
            .map(String::from)
            .to_vec(),
            visible_to: VisibilityFilter::All,
        }
    }

    pub fn require(&self, scope: &'static str) -> Result<(), ApiError> {
        if self.scopes.iter().any(|s| s == scope) {
            Ok(())
        } else {
            Err(ApiError::Forbidden(scope))
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl AuthConfig {
    /// The caller of `req`, or `None` when it presented nothing usable.
    pub fn principal(&self, req: &HttpRequest) -> Option<Principal> {
        let bearer = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if let Some(presented) = bearer {
            return self
                .tokens
                .iter()
                .find(|t| {
                    !t.token.is_empty()
                        && constant_time_eq(t.token.as_bytes(), presented.as_bytes())
                })
                .map(|t| Principal {
                    name: t.name.clone(),
                    scopes: t.scopes.clone(),
                    visible_to: t.visible_to.clone(),
                });
        }
        let loopback = req.peer_addr().is_some_and(|a| a.ip().is_loopback());
        (self.dev_bypass && loopback).then(Principal::operator)
    }

    /// The caller with `scope`, or 401 / 403.
    pub fn require(&self, req: &HttpRequest, scope: &'static str) -> Result<Principal, ApiError> {
        let p = self.principal(req).ok_or(ApiError::Unauthorized)?;
        p.require(scope)?;
        Ok(p)
    }
}
