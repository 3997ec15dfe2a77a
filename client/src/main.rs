//! `tensortune`: the command line. Thin: parse flags, set up tracing, run.

use clap::Parser;
use tensortune::cli::Cli;

fn main() -> std::process::ExitCode {
    // The worker re-executes this binary as its measuring child (fault isolation).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(tensortune_worker::COMPILE_CHILD_ARG) {
        return match tensortune_worker::compile_child_main() {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    if args.get(1).map(String::as_str) == Some(tensortune_worker::CHILD_ARG) {
        return child(args.get(2).map(String::as_str).unwrap_or("cuda:0"));
    }
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(tensortune::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn child(device: &str) -> std::process::ExitCode {
    let spec = match device.parse() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match tensortune_worker::child_main(spec) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
