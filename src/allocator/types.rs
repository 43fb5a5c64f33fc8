//! Domain identifiers shared by the whole engine.
use std::fmt;

/// Label carrying the application id on every executor pod.
pub const APP_ID_LABEL: &str = "spark-app-selector";
/// Label carrying the pod's role (`executor` or `driver`).
pub const ROLE_LABEL: &str = "spark-role";
/// Value of [`ROLE_LABEL`] on executor pods.
pub const EXECUTOR_ROLE: &str = "executor";
/// Label carrying the executor id.
pub const EXECUTOR_ID_LABEL: &str = "spark-exec-id";
/// Label carrying the resource profile id.
pub const RESOURCE_PROFILE_ID_LABEL: &str = "spark-exec-resourceprofile-id";
/// Pods with this label set to `true` are ignored everywhere.
pub const EXECUTOR_INACTIVE_LABEL: &str = "spark-exec-inactive";

/// An executor id: positive, unique within an application, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ExecutorId(pub u64);

impl fmt::Display for ExecutorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Items joined with ", " for a log line: ids read `3, 4` there, not as Rust's Debug text
/// (`[ExecutorId(3), ExecutorId(4)]`).
pub fn listed<T: fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let mut line = String::new();
    for item in items {
        if !line.is_empty() {
            line.push_str(", ");
        }
        line.push_str(&item.to_string());
    }
    line
}

/// A resource profile id (0 is the default profile).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ResourceProfileId(pub i32);

impl fmt::Display for ResourceProfileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

pub use crate::time::Timestamp;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_ids_read_as_numbers_not_debug_text() {
        assert_eq!(listed([ExecutorId(3), ExecutorId(4)]), "3, 4");
        assert_eq!(listed(Vec::<ExecutorId>::new()), "");
    }
}
