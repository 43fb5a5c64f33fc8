//! CLI wiring only. (Being built: issue 4.)
fn main() {}
