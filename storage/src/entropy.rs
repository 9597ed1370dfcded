//! Where the process's randomness comes from: generation suffixes, run ids, fence nonces, retry jitter.
//!
//! Each thread draws from its own generator: seeded from the operating system, unless
//! [`seed_this_thread`] fixed it. The simulator fixes it per seed, so the production code it drives on
//! one thread mints the same ids and waits the same jitter on every replay. Nothing here is secret-grade
//! except where the caller asks the operating system itself ([`secret_bytes`]).

use std::cell::RefCell;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

thread_local! {
    static RNG: RefCell<StdRng> = RefCell::new(StdRng::from_os_rng());
}

/// From now on this thread's draws are a function of `seed` alone.
pub fn seed_this_thread(seed: u64) {
    RNG.with(|r| *r.borrow_mut() = StdRng::seed_from_u64(seed));
}

/// A uniformly random `u32`.
pub fn u32() -> u32 {
    RNG.with(|r| r.borrow_mut().random())
}

/// A uniformly random `f64` in `[0, 1)`.
pub fn unit() -> f64 {
    RNG.with(|r| r.borrow_mut().random())
}

/// A uniformly random `f64` in `[lo, hi]`.
pub fn between(lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * unit()
}

/// `N` random bytes.
pub fn bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    RNG.with(|r| r.borrow_mut().fill_bytes(&mut out));
    out
}

/// A run id: a UUID v7 (time-ordered) of `now_ms` and this thread's draws.
pub fn run_id(now_ms: i64) -> crate::RunId {
    uuid::Builder::from_unix_timestamp_millis(now_ms.max(0) as u64, &bytes::<10>())
        .into_uuid()
        .to_string()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_thread_draws_the_same_ids_again_and_ids_are_v7_of_the_time() {
        seed_this_thread(7);
        let first = (run_id(1_800_000_000_000), u32(), unit());
        seed_this_thread(7);
        assert_eq!(first, (run_id(1_800_000_000_000), u32(), unit()));
        let id = uuid::Uuid::parse_str(&first.0).unwrap();
        assert_eq!(id.get_version_num(), 7);
        let (secs, _) = id.get_timestamp().unwrap().to_unix();
        assert_eq!(secs, 1_800_000_000);
        assert_ne!(run_id(1), run_id(1), "two draws differ");
    }
}
