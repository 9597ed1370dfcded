//! placeholder: `switchboard runs …` (being written).

/// `switchboard runs …` arguments.
#[derive(Debug, clap::Args)]
pub struct RunsArgs {}

pub fn run(_args: RunsArgs) -> anyhow::Result<()> {
    anyhow::bail!("switchboard runs is not implemented yet")
}
