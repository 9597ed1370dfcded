//! placeholder
pub mod ledger;
pub mod record;
