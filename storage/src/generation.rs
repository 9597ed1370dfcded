//! The process generation: the fencing token every live-run write carries.
//!
//! Minted once at boot as `YYYYMMDDTHHMMSSZ-xxxxxxxx` (UTC start time, then 8 random lowercase hex). It is
//! never reused: the random suffix separates two processes started in the same second. Its one persisted
//! and wire format is [`Generation::as_str`]; there is deliberately no `Display`, so every path that
//! writes it goes through that one spelling (pinned by `format_is_stable`).

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(String);

impl Generation {
    /// Mint a fresh generation for a process started at `now_ms`.
    pub fn mint(now_ms: i64) -> Self {
        let suffix = crate::entropy::u32();
        Generation(format!("{}-{suffix:08x}", utc_stamp(now_ms)))
    }

    /// Accept a stored or wire generation when it has the minted shape.
    pub fn parse(s: &str) -> Option<Self> {
        let b = s.as_bytes();
        let shape = b.len() == 25
            && b[..8].iter().all(u8::is_ascii_digit)
            && b[8] == b'T'
            && b[9..15].iter().all(u8::is_ascii_digit)
            && b[15] == b'Z'
            && b[16] == b'-'
            && b[17..]
                .iter()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c));
        shape.then(|| Generation(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `YYYYMMDDTHHMMSSZ` for an epoch-millisecond instant (proleptic Gregorian, UTC).
pub fn utc_stamp(now_ms: i64) -> String {
    let secs = now_ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_is_stable() {
        // 2026-09-07T23:15:12Z, the seed's example stamp.
        assert_eq!(utc_stamp(1_788_822_912_000), "20260907T231512Z");
        assert_eq!(utc_stamp(0), "19700101T000000Z");
        assert_eq!(utc_stamp(951_782_400_000), "20000229T000000Z");
        let g = Generation::mint(1_788_822_912_345);
        assert!(g.as_str().starts_with("20260907T231512Z-"), "{g:?}");
        assert_eq!(Generation::parse(g.as_str()), Some(g));
    }

    #[test]
    fn two_generations_minted_in_one_second_differ() {
        let a = Generation::mint(1_000);
        let b = Generation::mint(1_000);
        assert_ne!(a, b);
    }

    #[test]
    fn malformed_generations_are_refused() {
        for bad in [
            "",
            "20260907T231512Z",
            "20260907T231512Z-3FA9C1D2",
            "20260907X231512Z-3fa9c1d2",
            "x0260907T231512Z-3fa9c1d2",
        ] {
            assert_eq!(Generation::parse(bad), None, "{bad}");
        }
        assert!(Generation::parse("20260907T231512Z-3fa9c1d2").is_some());
    }
}
