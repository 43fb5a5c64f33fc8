//! The benchmark binary as a user runs it: a scenario prints each case with its ratio and
//! writes its plot.
use test_kit::process::{HANG_GUARD, run_successfully, service_command};

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator-bench");

fn command(args: &[&str]) -> tokio::process::Command {
    service_command(BIN, args)
}

#[tokio::test]
async fn bench_scale_up_prints_each_case_with_its_ratio_and_writes_the_plot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plot = dir.path().join("scale-up.png");
    let plot_arg = plot.to_str().expect("utf-8 path");
    let args = [
        "scale-up",
        "--executors",
        "30",
        "--runs",
        "1",
        "--cases",
        "spark-10,adaptive",
        "--time-scale",
        "5",
        "--start-delay-min-ms",
        "100",
        "--start-delay-max-ms",
        "200",
        "--plot",
        plot_arg,
    ];
    let stdout = run_successfully(command(&args), HANG_GUARD).await;
    for case in ["SPARK batch 10", "ADAPTIVE"] {
        let line = stdout
            .lines()
            .find(|l| l.contains(case) && l.contains("run 1:"))
            .unwrap_or_else(|| panic!("no run of {case} in\n{stdout}"));
        assert!(line.contains("s to 30 Running; limit"), "{line}");
        let ratio: f64 = line
            .split("ratio ")
            .nth(1)
            .and_then(|rest| rest.split(';').next())
            .and_then(|r| r.trim().parse().ok())
            .unwrap_or_else(|| panic!("no ratio in {line}"));
        assert!(ratio > 0.0, "{line}");
    }
    assert!(stdout.contains("ratio to limit"), "{stdout}");
    let png = std::fs::read(&plot).expect("the plot was written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
}
