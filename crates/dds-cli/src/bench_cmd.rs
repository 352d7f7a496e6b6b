use anyhow::Result;
use clap::Args;
#[derive(Args, Debug)]
pub struct BenchArgs {}
pub fn run(_a: BenchArgs) -> Result<()> {
    anyhow::bail!("no benchmarks yet")
}
