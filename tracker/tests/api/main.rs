//! End-to-end tests of the tracker over gRPC: a real server on `127.0.0.1:0`, a temporary
//! database, and a fake worker played by the test (no GPU needed).

mod auth;
mod binary;
mod budget;
mod drift;
mod energy;
mod finalists;
mod harness;
mod http;
mod leases;
mod lifecycle;
mod load;
mod model;
mod ops;
mod packs;
mod restart;
mod reuse;
mod shared;
mod streams;
mod union;
mod validation;
