//! igprof-analyse: reads IgProf-format profiles and prints reports.
fn main() {
    eprintln!("igprof-analyse: not built yet");
    std::process::exit(2);
}
