//! [`RunId`]: the id of one run, from the moment it is minted or read off the wire to the SQL that
//! stores it.
//!
//! A newtype so a run id never crosses a crate boundary bare (a thread key, a call id or a generation
//! is a `String` too, and mixing them up compiled). It is no gate: construction accepts any string, so an
//! id read from a URL that names no run still reaches the lookup that answers "not found";
//! [`crate::record::is_valid_run_id`] is where the shape is checked. Its JSON and SQL spelling is the
//! bare string ([`serde(transparent)`](serde), the `ToSql`/`FromSql` impls below), so nothing on the
//! wire or on disk changes.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

/// A run's id: a UUID v7 when [`crate::entropy::run_id`] minted it, whatever the caller sent otherwise.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RunId(String);

impl RunId {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl Deref for RunId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for RunId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// So a `HashMap<RunId, _>` or `BTreeMap<RunId, _>` answers a lookup by `&str`.
impl Borrow<str> for RunId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// The bare id, as logs and messages have always shown it.
impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Quoted like a `String`'s, so `{:?}` output reads as it did before the newtype.
impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl From<String> for RunId {
    fn from(id: String) -> Self {
        RunId(id)
    }
}

impl From<&str> for RunId {
    fn from(id: &str) -> Self {
        RunId(id.to_owned())
    }
}

impl From<&String> for RunId {
    fn from(id: &String) -> Self {
        RunId(id.clone())
    }
}

impl From<RunId> for String {
    fn from(id: RunId) -> Self {
        id.0
    }
}

impl PartialEq<str> for RunId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for RunId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<&RunId> for RunId {
    fn eq(&self, other: &&RunId) -> bool {
        self == *other
    }
}

impl PartialEq<String> for RunId {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl PartialEq<RunId> for str {
    fn eq(&self, other: &RunId) -> bool {
        self == other.0
    }
}

impl PartialEq<RunId> for &str {
    fn eq(&self, other: &RunId) -> bool {
        *self == other.0
    }
}

impl PartialEq<RunId> for String {
    fn eq(&self, other: &RunId) -> bool {
        *self == other.0
    }
}

/// SQLite stores the bare string.
impl rusqlite::types::ToSql for RunId {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        self.0.to_sql()
    }
}

impl rusqlite::types::FromSql for RunId {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        String::column_result(value).map(RunId)
    }
}

/// PostgreSQL stores the bare string (`text`).
impl postgres::types::ToSql for RunId {
    fn to_sql(
        &self,
        ty: &postgres::types::Type,
        out: &mut postgres::types::private::BytesMut,
    ) -> Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.0.to_sql(ty, out)
    }

    fn accepts(ty: &postgres::types::Type) -> bool {
        <String as postgres::types::ToSql>::accepts(ty)
    }

    fn to_sql_checked(
        &self,
        ty: &postgres::types::Type,
        out: &mut postgres::types::private::BytesMut,
    ) -> Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.0.to_sql_checked(ty, out)
    }
}

impl<'a> postgres::types::FromSql<'a> for RunId {
    fn from_sql(
        ty: &postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        String::from_sql(ty, raw).map(RunId)
    }

    fn accepts(ty: &postgres::types::Type) -> bool {
        <String as postgres::types::FromSql>::accepts(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_display_are_the_bare_string() {
        let id = RunId::from("r-1");
        assert_eq!(serde_json::to_string(&id).unwrap(), r#""r-1""#);
        assert_eq!(serde_json::from_str::<RunId>(r#""r-1""#).unwrap(), id);
        assert_eq!(id.to_string(), "r-1");
        assert_eq!(format!("{id:?}"), r#""r-1""#);
        let mut by_id = std::collections::HashMap::new();
        by_id.insert(id.clone(), 1);
        assert_eq!(by_id.get("r-1"), Some(&1));
    }
}
