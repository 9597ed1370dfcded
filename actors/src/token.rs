//! Capability tokens: `base64url(HMAC-SHA256(secret, run_id))` (SPEC §8.1).
//!
//! The secret lives in the database, so every process sharing it mints and verifies the same token for a
//! run. A token grants viewing, streaming and stopping that one run; it never appears in a read view.

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use storage::RunId;

#[derive(Clone)]
pub struct TokenMinter {
    secret: Vec<u8>,
}

impl std::fmt::Debug for TokenMinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenMinter(..)")
    }
}

impl TokenMinter {
    /// From the stored hex secret (falls back to its raw bytes when it is not hex).
    pub fn new(secret_hex: &str) -> Self {
        let secret = (0..secret_hex.len())
            .step_by(2)
            .map(|i| {
                secret_hex
                    .get(i..i + 2)
                    .and_then(|b| u8::from_str_radix(b, 16).ok())
            })
            .collect::<Option<Vec<u8>>>()
            .unwrap_or_else(|| secret_hex.as_bytes().to_vec());
        TokenMinter { secret }
    }

    fn mac(&self, run_id: &RunId) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.secret).expect("hmac takes any key length");
        mac.update(run_id.as_bytes());
        mac
    }

    pub fn mint(&self, run_id: &RunId) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(self.mac(run_id).finalize().into_bytes())
    }

    /// Constant-time check of `token` for `run_id`.
    pub fn verify(&self, run_id: &RunId, token: &str) -> bool {
        match base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token) {
            Ok(bytes) => self.mac(run_id).verify_slice(&bytes).is_ok(),
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_verifies_only_for_its_run_and_secret() {
        let m =
            TokenMinter::new("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff");
        let t = m.mint(&RunId::from("run-1"));
        assert!(m.verify(&RunId::from("run-1"), &t));
        assert!(!m.verify(&RunId::from("run-2"), &t));
        assert!(!m.verify(&RunId::from("run-1"), "not-a-token"));
        assert!(!TokenMinter::new("ff").verify(&RunId::from("run-1"), &t));
        assert!(!t.contains('=') && !t.contains('+') && !t.contains('/'));
    }
}
