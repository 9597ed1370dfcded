//! The coordinator's vocabulary: app ids, resource domains, modes, claims, and the conflict rule.
//!
//! Everything here is pure data. The one rule every other part of the coordinator builds on is
//! [`Claim::conflicts_with`]: two claims conflict when the resources they cover overlap and at least one
//! of them writes. The `repository` umbrella covers both `repository-ref` and `repository-worktree` (in
//! its own mode); every other domain covers only itself, so `repository-ref` and `repository-worktree`
//! are independent of each other.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

/// An app's identity: in Switchboard, the id of a run workspace (SPEC §10).
///
/// A newtype so that a bare number or string can never stand where an app handle is expected (the
/// seed's "never use a raw numeric appId"). Ids are ordered bytewise — the derived `Ord` of the inner
/// `String` compares UTF-8 bytes — and that is the one global order cross-app operations acquire in.
/// Note that it is not numeric order (`"10" < "9"`); what matters is that every caller uses the same
/// order, and the coordinator, not the caller, applies it.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AppId(String);

impl AppId {
    /// Wraps a workspace id. Deliberately takes `impl Into<String>`: integers do not convert.
    pub fn new(id: impl Into<String>) -> Self {
        AppId(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Debug for AppId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AppId({:?})", self.0)
    }
}

impl fmt::Display for AppId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A resource domain of an app, exactly the seed's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    /// The app's path and directory identity. Path consumers read; rename, relocation and deletion write.
    AppPath,
    /// Destructive chat/message mutations.
    ChatContent,
    /// Chat creation and app-deletion child snapshots.
    ChatMembership,
    /// Files in the app media collection.
    Media,
    /// Read-modify-write app metadata fields.
    Metadata,
    /// Provider associations and provider lifecycle state.
    Provider,
    /// Umbrella over [`Resource::RepositoryRef`] and [`Resource::RepositoryWorktree`].
    Repository,
    /// Git HEAD and refs. A read captures a stable commit without excluding a working-tree-only session.
    RepositoryRef,
    /// Git index and working-tree files.
    RepositoryWorktree,
    /// Process, proxy, port and sandbox lifecycle.
    Runtime,
    /// Environment/configuration consumed when starting the runtime.
    RuntimeConfig,
    /// Test execution inputs and test artifact mutations.
    TestFiles,
}

impl Resource {
    /// Every domain, in declaration order.
    pub const ALL: [Resource; 12] = [
        Resource::AppPath,
        Resource::ChatContent,
        Resource::ChatMembership,
        Resource::Media,
        Resource::Metadata,
        Resource::Provider,
        Resource::Repository,
        Resource::RepositoryRef,
        Resource::RepositoryWorktree,
        Resource::Runtime,
        Resource::RuntimeConfig,
        Resource::TestFiles,
    ];

    /// The seed's kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::AppPath => "app-path",
            Resource::ChatContent => "chat-content",
            Resource::ChatMembership => "chat-membership",
            Resource::Media => "media",
            Resource::Metadata => "metadata",
            Resource::Provider => "provider",
            Resource::Repository => "repository",
            Resource::RepositoryRef => "repository-ref",
            Resource::RepositoryWorktree => "repository-worktree",
            Resource::Runtime => "runtime",
            Resource::RuntimeConfig => "runtime-config",
            Resource::TestFiles => "test-files",
        }
    }

    /// The concrete domains this resource covers: the umbrella covers both repository subresources,
    /// every other resource covers itself.
    pub fn covers(self) -> &'static [Resource] {
        match self {
            Resource::Repository => &[Resource::RepositoryRef, Resource::RepositoryWorktree],
            Resource::AppPath => &[Resource::AppPath],
            Resource::ChatContent => &[Resource::ChatContent],
            Resource::ChatMembership => &[Resource::ChatMembership],
            Resource::Media => &[Resource::Media],
            Resource::Metadata => &[Resource::Metadata],
            Resource::Provider => &[Resource::Provider],
            Resource::RepositoryRef => &[Resource::RepositoryRef],
            Resource::RepositoryWorktree => &[Resource::RepositoryWorktree],
            Resource::Runtime => &[Resource::Runtime],
            Resource::RuntimeConfig => &[Resource::RuntimeConfig],
            Resource::TestFiles => &[Resource::TestFiles],
        }
    }

    /// Whether the two resources cover a common concrete domain.
    pub fn overlaps(self, other: Resource) -> bool {
        self.covers().iter().any(|r| other.covers().contains(r))
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The name is not one of the seed's resource domains.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown resource domain {0:?}")]
pub struct UnknownResource(pub String);

impl FromStr for Resource {
    type Err = UnknownResource;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Resource::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownResource(s.to_owned()))
    }
}

/// How a claim uses its resource. `Write` is greater than `Read`, so merging keeps the stronger mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    Read,
    Write,
}

/// One resource in one mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Claim {
    pub resource: Resource,
    pub mode: Mode,
}

impl Claim {
    pub fn read(resource: Resource) -> Self {
        Claim {
            resource,
            mode: Mode::Read,
        }
    }

    pub fn write(resource: Resource) -> Self {
        Claim {
            resource,
            mode: Mode::Write,
        }
    }

    /// Read/read is compatible; read/write and write/write conflict where the resources overlap.
    pub fn conflicts_with(&self, other: &Claim) -> bool {
        (self.mode == Mode::Write || other.mode == Mode::Write)
            && self.resource.overlaps(other.resource)
    }
}

/// The full resource set an operation declares for one app.
///
/// Claiming a resource twice keeps the stronger mode, so a set holds at most one mode per resource.
/// The umbrella and a subresource may both appear (`repository: read` with `repository-worktree:
/// write`); the conflict rule handles the overlap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims(BTreeMap<Resource, Mode>);

impl Claims {
    pub fn new() -> Self {
        Claims::default()
    }

    /// Adds `resource` in read mode (kept as write if already written).
    pub fn read(self, resource: Resource) -> Self {
        self.with(Claim::read(resource))
    }

    /// Adds `resource` in write mode.
    pub fn write(self, resource: Resource) -> Self {
        self.with(Claim::write(resource))
    }

    pub fn with(mut self, claim: Claim) -> Self {
        self.insert(claim);
        self
    }

    pub fn insert(&mut self, claim: Claim) {
        let mode = self.0.entry(claim.resource).or_insert(claim.mode);
        *mode = (*mode).max(claim.mode);
    }

    /// Union with `other`, keeping the stronger mode per resource (de-duplicating a cross-app request
    /// that names the same app twice).
    pub fn merge(&mut self, other: &Claims) {
        for claim in other.iter() {
            self.insert(claim);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = Claim> + '_ {
        self.0
            .iter()
            .map(|(&resource, &mode)| Claim { resource, mode })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The mode this set claims `resource` in, if it names it.
    pub fn mode_of(&self, resource: Resource) -> Option<Mode> {
        self.0.get(&resource).copied()
    }

    /// Whether any claim of `self` conflicts with any claim of `other`.
    pub fn conflicts_with(&self, other: &Claims) -> bool {
        self.iter()
            .any(|a| other.iter().any(|b| a.conflicts_with(&b)))
    }

    /// The concrete domains on which `self` and `other` conflict: for every conflicting pair, the
    /// domains both cover. The bypass rule asks whether all of them are owned by the queued
    /// operation's blockers.
    pub fn conflict_domains(&self, other: &Claims) -> BTreeSet<Resource> {
        let mut out = BTreeSet::new();
        for a in self.iter() {
            for b in other.iter().filter(|b| a.conflicts_with(b)) {
                out.extend(
                    a.resource
                        .covers()
                        .iter()
                        .filter(|r| b.resource.covers().contains(r)),
                );
            }
        }
        out
    }

    /// The concrete domains this set touches in any mode (what its holder "owns").
    pub fn domains(&self) -> BTreeSet<Resource> {
        self.iter()
            .flat_map(|c| c.resource.covers().iter().copied())
            .collect()
    }
}

impl From<Claim> for Claims {
    fn from(claim: Claim) -> Self {
        Claims::new().with(claim)
    }
}

impl<const N: usize> From<[Claim; N]> for Claims {
    fn from(claims: [Claim; N]) -> Self {
        claims.into_iter().collect()
    }
}

impl FromIterator<Claim> for Claims {
    fn from_iter<I: IntoIterator<Item = Claim>>(iter: I) -> Self {
        let mut out = Claims::new();
        for claim in iter {
            out.insert(claim);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The conflict rule, spelled out independently: which (a, b) resource pairs share a domain.
    fn shares_domain(a: Resource, b: Resource) -> bool {
        use Resource::*;
        a == b
            || matches!(
                (a, b),
                (Repository, RepositoryRef)
                    | (RepositoryRef, Repository)
                    | (Repository, RepositoryWorktree)
                    | (RepositoryWorktree, Repository)
            )
    }

    #[test]
    fn conflict_rule_matches_the_seed_for_every_pair_of_claims() {
        // Every resource pair in every mode pair: read/read never conflicts; otherwise a conflict is
        // exactly a shared domain (same resource, or the umbrella against either subresource).
        for a in Resource::ALL {
            for b in Resource::ALL {
                for (ma, mb) in [
                    (Mode::Read, Mode::Read),
                    (Mode::Read, Mode::Write),
                    (Mode::Write, Mode::Read),
                    (Mode::Write, Mode::Write),
                ] {
                    let expected = shares_domain(a, b) && (ma == Mode::Write || mb == Mode::Write);
                    let got = Claim {
                        resource: a,
                        mode: ma,
                    }
                    .conflicts_with(&Claim {
                        resource: b,
                        mode: mb,
                    });
                    assert_eq!(got, expected, "{a} {ma:?} vs {b} {mb:?}");
                }
            }
        }
        // The two subresources are independent even when both write.
        assert!(!Claim::write(Resource::RepositoryRef)
            .conflicts_with(&Claim::write(Resource::RepositoryWorktree)));
    }

    #[test]
    fn claiming_twice_keeps_the_stronger_mode() {
        let claims = Claims::new()
            .read(Resource::Media)
            .write(Resource::Media)
            .read(Resource::Media);
        assert_eq!(claims.mode_of(Resource::Media), Some(Mode::Write));
        assert_eq!(claims.iter().count(), 1);

        let mut a = Claims::new().read(Resource::Metadata);
        a.merge(
            &Claims::new()
                .write(Resource::Metadata)
                .read(Resource::Provider),
        );
        assert_eq!(a.mode_of(Resource::Metadata), Some(Mode::Write));
        assert_eq!(a.mode_of(Resource::Provider), Some(Mode::Read));
    }

    #[test]
    fn conflict_domains_name_only_the_overlap() {
        // An umbrella writer against a ref reader conflicts on the ref only, not on the worktree.
        let writer = Claims::new()
            .write(Resource::Repository)
            .write(Resource::ChatContent);
        let reader = Claims::new()
            .read(Resource::RepositoryRef)
            .write(Resource::ChatContent);
        let domains: Vec<_> = writer.conflict_domains(&reader).into_iter().collect();
        assert_eq!(
            domains,
            vec![Resource::ChatContent, Resource::RepositoryRef]
        );
    }

    #[test]
    fn resource_names_round_trip() {
        for r in Resource::ALL {
            assert_eq!(r.as_str().parse::<Resource>(), Ok(r));
        }
        assert!("repo".parse::<Resource>().is_err());
    }

    #[test]
    fn app_ids_order_bytewise() {
        let mut ids = [
            AppId::new("b"),
            AppId::new("9"),
            AppId::new("10"),
            AppId::new("B"),
            AppId::new("a"),
        ];
        ids.sort();
        let names: Vec<_> = ids.iter().map(AppId::as_str).collect();
        assert_eq!(names, vec!["10", "9", "B", "a", "b"]);
    }
}
