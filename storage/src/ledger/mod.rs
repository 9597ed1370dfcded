//! The live-run ledger.
pub mod decisions;
