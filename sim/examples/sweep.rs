//! Run the simulator without building the whole binary:
//! `cargo run -p sim --example sweep -- --seeds 10000` (a sweep over every core), or
//! `cargo run -p sim --example sweep -- --seed 64` (one seed, with its trace).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match sim::cli::parse(&args) {
        Ok(args) => std::process::exit(sim::cli::run(&args)),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
}
