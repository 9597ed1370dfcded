//! The visibility filter: which runs a caller may see, in wire form ([`VisibilityFilter`]), its
//! bounded parse of untrusted JSON ([`FilterError`]) and its one truth table (`matches`). The SQLite
//! store compiles the same filter to SQL.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::model::{ChannelVisibility, RunHead};
use super::validate::echo;

/// Which runs a caller may see: the authorization predicate in wire form (SPEC §2).
///
/// JSON: `{"kind":"all"} | {"kind":"none"} | {"kind":"channels-in","ids":[…]} |
/// {"kind":"user-is","id":…} | {"kind":"visibility-in","values":[…]} | {"kind":"or","of":[…]} |
/// {"kind":"and","of":[…]}`. Bounded to [`MAX_FILTER_DEPTH`] levels and [`MAX_FILTER_LEAVES`]
/// leaf values so the SQL it compiles to has a bounded number of parameters.
///
/// Build one from untrusted JSON with [`VisibilityFilter::parse`]; a value obtained through serde
/// directly (config) must pass [`VisibilityFilter::validate`] before use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum VisibilityFilter {
    /// Every run.
    All,
    /// No run (the default for a token without a filter).
    None,
    /// Runs in one of these channels.
    ChannelsIn { ids: Vec<String> },
    /// Runs started by this user.
    UserIs { id: String },
    /// Runs whose channel has one of these visibilities.
    VisibilityIn { values: Vec<ChannelVisibility> },
    /// Any of; empty matches nothing.
    Or { of: Vec<VisibilityFilter> },
    /// All of; empty matches nothing (an empty conjunction never grants everything).
    And { of: Vec<VisibilityFilter> },
}

/// Deepest nesting allowed; a leaf alone has depth 1.
pub const MAX_FILTER_DEPTH: usize = 4;

/// Most leaf values allowed: each channel id, each visibility value and each `user-is` counts one.
pub const MAX_FILTER_LEAVES: usize = 100;

/// Why JSON is not a visibility filter; `path` locates the node (`$`, `$.of[1]`, …).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FilterError {
    #[error("filter {path} is not a json object")]
    NotObject { path: String },
    #[error("filter {path} has no string kind")]
    MissingKind { path: String },
    #[error("filter {path} has unknown kind {kind:?}")]
    UnknownKind { path: String, kind: String },
    #[error("filter {path} field {field} must be {expected}")]
    Field {
        path: String,
        field: &'static str,
        expected: &'static str,
    },
    #[error("filter {path} has unexpected field {field:?}")]
    UnexpectedField { path: String, field: String },
    #[error("filter {path} has unknown visibility {value:?}")]
    UnknownVisibility { path: String, value: String },
    #[error("filter nests deeper than {max} levels")]
    TooDeep { max: usize },
    #[error("filter has more than {max} leaf values")]
    TooWide { max: usize },
}

impl VisibilityFilter {
    /// Parse untrusted JSON. Any defect is a typed error naming where it is; nothing falls back to
    /// `all`. Unknown keys on a node are refused too: a predicate this version cannot read fully
    /// is not one it may apply.
    pub fn parse(v: &Value) -> Result<Self, FilterError> {
        let mut leaves = 0;
        parse_filter(v, 1, "$", &mut leaves)
    }

    /// Check the depth and width bounds (for a filter that did not come through [`Self::parse`]).
    pub fn validate(&self) -> Result<(), FilterError> {
        if self.depth() > MAX_FILTER_DEPTH {
            return Err(FilterError::TooDeep {
                max: MAX_FILTER_DEPTH,
            });
        }
        if self.leaves() > MAX_FILTER_LEAVES {
            return Err(FilterError::TooWide {
                max: MAX_FILTER_LEAVES,
            });
        }
        Ok(())
    }

    /// The one truth table. `none`, an empty `or` and an empty `and` match nothing; a row
    /// without a stamp is passed in as [`ChannelVisibility::Unknown`].
    pub fn matches(&self, channel_id: &str, user_id: &str, visibility: ChannelVisibility) -> bool {
        match self {
            VisibilityFilter::All => true,
            VisibilityFilter::None => false,
            VisibilityFilter::ChannelsIn { ids } => ids.iter().any(|id| id == channel_id),
            VisibilityFilter::UserIs { id } => id == user_id,
            VisibilityFilter::VisibilityIn { values } => values.contains(&visibility),
            VisibilityFilter::Or { of } => of
                .iter()
                .any(|f| f.matches(channel_id, user_id, visibility)),
            VisibilityFilter::And { of } => {
                !of.is_empty()
                    && of
                        .iter()
                        .all(|f| f.matches(channel_id, user_id, visibility))
            }
        }
    }

    /// [`Self::matches`] on a record or listing row.
    pub fn matches_head(&self, h: &RunHead) -> bool {
        self.matches(&h.channel_id, &h.user_id, h.channel_visibility)
    }

    /// The same predicate with every set sorted and deduplicated, so equal filters compare and
    /// compile (to SQL, to cache keys) identically.
    pub fn normalized(self) -> Self {
        match self {
            VisibilityFilter::ChannelsIn { mut ids } => {
                ids.sort();
                ids.dedup();
                VisibilityFilter::ChannelsIn { ids }
            }
            VisibilityFilter::VisibilityIn { mut values } => {
                values.sort_by_key(|v| v.as_str());
                values.dedup();
                VisibilityFilter::VisibilityIn { values }
            }
            VisibilityFilter::Or { of } => VisibilityFilter::Or {
                of: of.into_iter().map(Self::normalized).collect(),
            },
            VisibilityFilter::And { of } => VisibilityFilter::And {
                of: of.into_iter().map(Self::normalized).collect(),
            },
            other => other,
        }
    }

    /// Nesting depth; a leaf (or an empty `or`/`and`) is 1.
    fn depth(&self) -> usize {
        match self {
            VisibilityFilter::Or { of } | VisibilityFilter::And { of } => {
                1 + of.iter().map(Self::depth).max().unwrap_or(0)
            }
            _ => 1,
        }
    }

    /// Leaf values, counted as [`MAX_FILTER_LEAVES`] counts them.
    fn leaves(&self) -> usize {
        match self {
            VisibilityFilter::All | VisibilityFilter::None => 0,
            VisibilityFilter::ChannelsIn { ids } => ids.len(),
            VisibilityFilter::UserIs { .. } => 1,
            VisibilityFilter::VisibilityIn { values } => values.len(),
            VisibilityFilter::Or { of } | VisibilityFilter::And { of } => {
                of.iter().map(Self::leaves).sum()
            }
        }
    }
}

/// Add `n` leaf values to the running count, refusing once it passes [`MAX_FILTER_LEAVES`].
fn count_leaves(leaves: &mut usize, n: usize) -> Result<(), FilterError> {
    *leaves = leaves.saturating_add(n);
    if *leaves > MAX_FILTER_LEAVES {
        return Err(FilterError::TooWide {
            max: MAX_FILTER_LEAVES,
        });
    }
    Ok(())
}

/// Parse one node at `depth` (root = 1), counting leaves as it goes so an over-wide or over-deep
/// filter is refused before the rest of it is read.
fn parse_filter(
    v: &Value,
    depth: usize,
    path: &str,
    leaves: &mut usize,
) -> Result<VisibilityFilter, FilterError> {
    if depth > MAX_FILTER_DEPTH {
        return Err(FilterError::TooDeep {
            max: MAX_FILTER_DEPTH,
        });
    }
    let obj = v.as_object().ok_or_else(|| FilterError::NotObject {
        path: path.to_owned(),
    })?;
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .ok_or_else(|| FilterError::MissingKind {
            path: path.to_owned(),
        })?;
    // The one body field each kind takes, and what it must hold.
    let (body_field, expected): (Option<&'static str>, &'static str) = match kind {
        "all" | "none" => (None, "absent"),
        "channels-in" => (Some("ids"), "an array of strings"),
        "user-is" => (Some("id"), "a string"),
        "visibility-in" => (Some("values"), "an array of visibilities"),
        "or" | "and" => (Some("of"), "an array of filters"),
        other => {
            return Err(FilterError::UnknownKind {
                path: path.to_owned(),
                kind: echo(other),
            })
        }
    };
    if let Some(field) = obj
        .keys()
        .find(|k| k.as_str() != "kind" && Some(k.as_str()) != body_field)
    {
        return Err(FilterError::UnexpectedField {
            path: path.to_owned(),
            field: echo(field),
        });
    }
    let Some(body_field) = body_field else {
        return Ok(if kind == "all" {
            VisibilityFilter::All
        } else {
            VisibilityFilter::None
        });
    };
    let field_error = || FilterError::Field {
        path: path.to_owned(),
        field: body_field,
        expected,
    };
    let body = obj.get(body_field).ok_or_else(field_error)?;
    if kind == "user-is" {
        count_leaves(leaves, 1)?;
        let id = body.as_str().ok_or_else(field_error)?.to_owned();
        return Ok(VisibilityFilter::UserIs { id });
    }
    let items = body.as_array().ok_or_else(field_error)?;
    let filter = match kind {
        "channels-in" => {
            count_leaves(leaves, items.len())?;
            let ids = items
                .iter()
                .map(|id| id.as_str().map(str::to_owned).ok_or_else(field_error))
                .collect::<Result<_, _>>()?;
            VisibilityFilter::ChannelsIn { ids }
        }
        "visibility-in" => {
            count_leaves(leaves, items.len())?;
            let values = items
                .iter()
                .map(|value| {
                    let s = value.as_str().ok_or_else(field_error)?;
                    ChannelVisibility::parse(s).ok_or_else(|| FilterError::UnknownVisibility {
                        path: path.to_owned(),
                        value: echo(s),
                    })
                })
                .collect::<Result<_, _>>()?;
            VisibilityFilter::VisibilityIn { values }
        }
        _ => {
            let of = items
                .iter()
                .enumerate()
                .map(|(i, child)| {
                    parse_filter(child, depth + 1, &format!("{path}.of[{i}]"), leaves)
                })
                .collect::<Result<_, _>>()?;
            if kind == "or" {
                VisibilityFilter::Or { of }
            } else {
                VisibilityFilter::And { of }
            }
        }
    };
    Ok(filter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::record::fixtures::with;
    use crate::record::validate::validate_record;

    fn filter(v: Value) -> VisibilityFilter {
        VisibilityFilter::parse(&v).expect("valid filter")
    }

    #[test]
    fn visibility_truth_table() {
        use ChannelVisibility as V;
        // (filter, channel, user, visibility, matches)
        let rows: Vec<(Value, &str, &str, V, bool)> = vec![
            (json!({"kind": "all"}), "C1", "U1", V::Unknown, true),
            (json!({"kind": "none"}), "C1", "U1", V::Public, false),
            (
                json!({"kind": "channels-in", "ids": ["C1", "C2"]}),
                "C2",
                "U9",
                V::Private,
                true,
            ),
            (
                json!({"kind": "channels-in", "ids": ["C1"]}),
                "C3",
                "U1",
                V::Public,
                false,
            ),
            (
                json!({"kind": "channels-in", "ids": []}),
                "C1",
                "U1",
                V::Public,
                false,
            ),
            (
                json!({"kind": "user-is", "id": "U1"}),
                "C9",
                "U1",
                V::Dm,
                true,
            ),
            (
                json!({"kind": "user-is", "id": "U1"}),
                "C9",
                "U2",
                V::Dm,
                false,
            ),
            (
                json!({"kind": "visibility-in", "values": ["public"]}),
                "C1",
                "U1",
                V::Public,
                true,
            ),
            (
                json!({"kind": "visibility-in", "values": ["public"]}),
                "C1",
                "U1",
                V::Unknown,
                false,
            ),
            (
                json!({"kind": "visibility-in", "values": ["unknown"]}),
                "C1",
                "U1",
                V::Unknown,
                true,
            ),
            (
                json!({"kind": "visibility-in", "values": []}),
                "C1",
                "U1",
                V::Public,
                false,
            ),
            (
                json!({"kind": "or", "of": []}),
                "C1",
                "U1",
                V::Public,
                false,
            ),
            (
                json!({"kind": "and", "of": []}),
                "C1",
                "U1",
                V::Public,
                false,
            ),
            (
                json!({"kind": "or", "of": [{"kind": "user-is", "id": "U1"}, {"kind": "visibility-in", "values": ["public"]}]}),
                "C1",
                "U2",
                V::Public,
                true,
            ),
            (
                json!({"kind": "or", "of": [{"kind": "user-is", "id": "U1"}, {"kind": "visibility-in", "values": ["public"]}]}),
                "C1",
                "U2",
                V::Private,
                false,
            ),
            (
                json!({"kind": "and", "of": [{"kind": "channels-in", "ids": ["C1"]}, {"kind": "user-is", "id": "U1"}]}),
                "C1",
                "U1",
                V::Private,
                true,
            ),
            (
                json!({"kind": "and", "of": [{"kind": "channels-in", "ids": ["C1"]}, {"kind": "user-is", "id": "U1"}]}),
                "C1",
                "U2",
                V::Private,
                false,
            ),
            (
                json!({"kind": "and", "of": [{"kind": "all"}, {"kind": "none"}]}),
                "C1",
                "U1",
                V::Public,
                false,
            ),
            (
                json!({"kind": "or", "of": [{"kind": "none"}, {"kind": "and", "of": [{"kind": "all"}]}]}),
                "C1",
                "U1",
                V::Public,
                true,
            ),
        ];
        for (wire, channel, user, visibility, expected) in rows {
            let f = filter(wire.clone());
            assert_eq!(
                f.matches(channel, user, visibility),
                expected,
                "{wire} on ({channel}, {user}, {visibility:?})"
            );
        }
    }

    #[test]
    fn a_row_without_a_stamp_matches_as_unknown_never_public() {
        let row = validate_record(&with("channelVisibility", None))
            .expect("valid")
            .head;
        assert!(!filter(json!({"kind": "visibility-in", "values": ["public"]})).matches_head(&row));
        assert!(filter(json!({"kind": "visibility-in", "values": ["unknown"]})).matches_head(&row));
        assert!(filter(json!({"kind": "user-is", "id": "U1"})).matches_head(&row));
    }

    #[test]
    fn filter_wire_form_round_trips_through_serde() {
        let wire = json!({"kind": "or", "of": [
            {"kind": "all"}, {"kind": "none"},
            {"kind": "channels-in", "ids": ["C1"]},
            {"kind": "user-is", "id": "U1"},
            {"kind": "visibility-in", "values": ["dm", "machine"]},
            {"kind": "and", "of": []},
        ]});
        let parsed = filter(wire.clone());
        assert_eq!(serde_json::to_value(&parsed).expect("ser"), wire);
        let via_serde: VisibilityFilter = serde_json::from_value(wire).expect("derive reads it");
        assert_eq!(via_serde, parsed);
    }

    #[test]
    fn filter_parse_errors_are_typed_and_never_fall_back_to_all() {
        use FilterError as E;
        let cases: Vec<(Value, FilterError)> = vec![
            (json!("all"), E::NotObject { path: "$".into() }),
            (json!({}), E::MissingKind { path: "$".into() }),
            (json!({"kind": 1}), E::MissingKind { path: "$".into() }),
            (
                json!({"kind": "repos-in", "ids": []}),
                E::UnknownKind {
                    path: "$".into(),
                    kind: "repos-in".into(),
                },
            ),
            (
                json!({"kind": "ALL"}),
                E::UnknownKind {
                    path: "$".into(),
                    kind: "ALL".into(),
                },
            ),
            (
                json!({"kind": "all", "ids": []}),
                E::UnexpectedField {
                    path: "$".into(),
                    field: "ids".into(),
                },
            ),
            (
                json!({"kind": "channels-in"}),
                E::Field {
                    path: "$".into(),
                    field: "ids",
                    expected: "an array of strings",
                },
            ),
            (
                json!({"kind": "channels-in", "ids": "C1"}),
                E::Field {
                    path: "$".into(),
                    field: "ids",
                    expected: "an array of strings",
                },
            ),
            (
                json!({"kind": "channels-in", "ids": [1]}),
                E::Field {
                    path: "$".into(),
                    field: "ids",
                    expected: "an array of strings",
                },
            ),
            (
                json!({"kind": "user-is", "id": 5}),
                E::Field {
                    path: "$".into(),
                    field: "id",
                    expected: "a string",
                },
            ),
            (
                json!({"kind": "visibility-in", "values": ["public", "secret"]}),
                E::UnknownVisibility {
                    path: "$".into(),
                    value: "secret".into(),
                },
            ),
            (
                json!({"kind": "visibility-in", "values": [null]}),
                E::Field {
                    path: "$".into(),
                    field: "values",
                    expected: "an array of visibilities",
                },
            ),
            (
                json!({"kind": "or", "of": {}}),
                E::Field {
                    path: "$".into(),
                    field: "of",
                    expected: "an array of filters",
                },
            ),
            (
                json!({"kind": "and", "of": [{"kind": "all"}, {"kind": "nope"}]}),
                E::UnknownKind {
                    path: "$.of[1]".into(),
                    kind: "nope".into(),
                },
            ),
            (
                json!({"kind": "or", "of": [[]]}),
                E::NotObject {
                    path: "$.of[0]".into(),
                },
            ),
        ];
        for (wire, expected) in cases {
            assert_eq!(
                VisibilityFilter::parse(&wire).err(),
                Some(expected),
                "{wire}"
            );
        }
        let message = VisibilityFilter::parse(&json!({"kind": "user-is"}))
            .expect_err("refused")
            .to_string();
        assert_eq!(message, "filter $ field id must be a string");
    }

    /// `levels` nested `or`s around one leaf: depth `levels + 1`.
    fn nested(levels: usize) -> Value {
        (0..levels).fold(
            json!({"kind": "user-is", "id": "U1"}),
            |inner, _| json!({"kind": "or", "of": [inner]}),
        )
    }

    #[test]
    fn filter_depth_is_bounded_to_four() {
        assert!(VisibilityFilter::parse(&nested(MAX_FILTER_DEPTH - 1)).is_ok());
        assert_eq!(
            VisibilityFilter::parse(&nested(MAX_FILTER_DEPTH)).err(),
            Some(FilterError::TooDeep {
                max: MAX_FILTER_DEPTH
            })
        );
        // a hostile, very deep filter is refused without walking all of it
        assert_eq!(
            VisibilityFilter::parse(&nested(100)).err(),
            Some(FilterError::TooDeep {
                max: MAX_FILTER_DEPTH
            })
        );
        let too_deep: VisibilityFilter =
            serde_json::from_value(nested(MAX_FILTER_DEPTH)).expect("serde allows it");
        assert_eq!(
            too_deep.validate(),
            Err(FilterError::TooDeep {
                max: MAX_FILTER_DEPTH
            })
        );
        assert_eq!(filter(nested(3)).validate(), Ok(()));
    }

    #[test]
    fn filter_width_is_bounded_to_one_hundred_leaf_values() {
        let ids: Vec<String> = (0..MAX_FILTER_LEAVES).map(|i| format!("C{i}")).collect();
        let at_limit = json!({"kind": "channels-in", "ids": ids});
        assert_eq!(filter(at_limit.clone()).validate(), Ok(()));
        // ids, values and user-is all count, across the whole tree
        let over = json!({"kind": "or", "of": [at_limit, {"kind": "user-is", "id": "U1"}]});
        assert_eq!(
            VisibilityFilter::parse(&over).err(),
            Some(FilterError::TooWide {
                max: MAX_FILTER_LEAVES
            })
        );
        let values: Vec<&str> = std::iter::repeat_n("public", 60).collect();
        let split = json!({"kind": "and", "of": [
            {"kind": "visibility-in", "values": values},
            {"kind": "channels-in", "ids": (0..41).map(|i| format!("C{i}")).collect::<Vec<_>>()},
        ]});
        assert_eq!(
            VisibilityFilter::parse(&split).err(),
            Some(FilterError::TooWide {
                max: MAX_FILTER_LEAVES
            })
        );
        let wide: VisibilityFilter = serde_json::from_value(over).expect("serde allows it");
        assert_eq!(
            wide.validate(),
            Err(FilterError::TooWide {
                max: MAX_FILTER_LEAVES
            })
        );
    }

    #[test]
    fn normalized_filter_sorts_and_dedups_sets_without_changing_its_meaning() {
        let f = filter(json!({"kind": "or", "of": [
            {"kind": "channels-in", "ids": ["C3", "C1", "C3", "C2"]},
            {"kind": "visibility-in", "values": ["public", "dm", "public"]},
        ]}));
        let n = f.clone().normalized();
        assert_eq!(
            serde_json::to_value(&n).expect("ser"),
            json!({"kind": "or", "of": [
                {"kind": "channels-in", "ids": ["C1", "C2", "C3"]},
                {"kind": "visibility-in", "values": ["dm", "public"]},
            ]})
        );
        for channel in ["C1", "C4"] {
            for v in ChannelVisibility::ALL {
                assert_eq!(f.matches(channel, "U", v), n.matches(channel, "U", v));
            }
        }
    }
}
