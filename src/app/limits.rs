//! Bounds on the work one request may cause (the configuration's `limits`): most are the
//! templates' (the `templates` module holds a request's templates to them), the others cap
//! an application's executors and the creates of one round.
use serde::Deserialize;

/// Bounds on the work one request can cause (`limits` in the configuration), so that no
/// request can stall the service or hold memory without bound.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RequestLimits {
    /// Longest pod template, in bytes (default 256 KiB).
    pub max_template_bytes: usize,
    /// Deepest nesting of a template (block indentation levels plus open `[`/`{`), checked
    /// by a linear scan before the YAML parser, whose time grows with the square of the
    /// depth (default 32; a Spark executor pod nests about 10 deep).
    pub max_template_depth: usize,
    /// Resource profiles (templates) an application may have, its executor template
    /// included (default 64).
    pub max_resource_profiles: usize,
    /// Lifetime cap on the executors of an application: what `settings.max_executors`
    /// defaults to, and the most it may be set to (default 10,000).
    pub max_executors_per_application: u64,
    /// Creates one allocation round of an application may plan, over all its profiles
    /// (default 500; Spark's batch size applies per profile under it).
    pub max_creates_per_round: u32,
    /// Templates parsed at once, off the async runtime (0 = one per CPU).
    pub template_parsers: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_template_bytes: 256 * 1024,
            max_template_depth: 32,
            max_resource_profiles: 64,
            max_executors_per_application: 10_000,
            max_creates_per_round: 500,
            template_parsers: 0,
        }
    }
}

impl RequestLimits {
    /// The rule a value breaks, as `(key, reason)`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let positive = [
            ("max_template_bytes", self.max_template_bytes as u64),
            ("max_template_depth", self.max_template_depth as u64),
            ("max_resource_profiles", self.max_resource_profiles as u64),
            (
                "max_executors_per_application",
                self.max_executors_per_application,
            ),
            (
                "max_creates_per_round",
                u64::from(self.max_creates_per_round),
            ),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err((key, "must be greater than 0".into()));
            }
        }
        Ok(())
    }

    /// How many templates may be parsed at once.
    pub fn parsers(&self) -> usize {
        if self.template_parsers > 0 {
            return self.template_parsers;
        }
        std::thread::available_parallelism().map_or(2, usize::from)
    }
}
