//! ResourceQuota, as the API server's quota admission plugin and the resourcequota
//! controller keep it, for `pods`, `requests.cpu` (or `cpu`) and `requests.memory` (or
//! `memory`): a pod create that would take a quota's `status.used` past its
//! `status.hard` is refused 403 Forbidden with the real message
//! (`exceeded quota: NAME, requested: pods=1, used: pods=20, limited: pods=20`, only the
//! resources exceeded, sorted), and `status` (hard from `spec.hard`, used) is kept
//! current. Differences from a real cluster: the controller's work is done at once, in the
//! same step as the pod's change (a real one recalculates on its own period, so a freed
//! quota shows later there); scopes, scope selectors, `limits.*`, `count/*` and other
//! resources are not counted; a pod without a request that a quota tracks is counted as
//! requesting 0 (a real API server refuses it: "must specify requests.cpu").
use serde_json::{Map, Value, json};

use crate::quantity::quantity;
use crate::status::ApiError;

/// A resource a quota may track, in whole units (pods, millicores, bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Resource {
    Pods,
    Cpu,
    Memory,
}

/// The resource a `spec.hard` key names, if counted here.
fn resource(key: &str) -> Option<Resource> {
    match key {
        "pods" => Some(Resource::Pods),
        "requests.cpu" | "cpu" => Some(Resource::Cpu),
        "requests.memory" | "memory" => Some(Resource::Memory),
        _ => None,
    }
}

/// What one pod counts against a quota: 1 pod and its requests, unless it has ended
/// (Succeeded or Failed pods count for nothing, as in the real evaluator).
fn pod_usage(pod: &Value) -> [u64; 3] {
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return [0, 0, 0];
    }
    let requests = |containers: Option<&Value>| -> (u64, u64) {
        let mut cpu = 0u64;
        let mut memory = 0u64;
        for c in containers.and_then(Value::as_array).into_iter().flatten() {
            let get = |name: &str| {
                c.pointer(&format!("/resources/requests/{name}"))
                    .or_else(|| c.pointer(&format!("/resources/limits/{name}")))
                    .and_then(quantity)
            };
            cpu += get("cpu").map_or(0, |v| (v * 1000.0).ceil() as u64);
            memory += get("memory").map_or(0, |v| v.ceil() as u64);
        }
        (cpu, memory)
    };
    let (cpu, memory) = requests(pod.pointer("/spec/containers"));
    // An init container runs alone: the pod requests the larger of the two.
    let mut init = (0u64, 0u64);
    for c in pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let one = requests(Some(&json!([c])));
        init = (init.0.max(one.0), init.1.max(one.1));
    }
    [1, cpu.max(init.0), memory.max(init.1)]
}

fn index(r: Resource) -> usize {
    r as usize
}

/// A quota's hard limits among the resources counted here, in whole units.
fn hard_of(quota: &Value) -> Vec<(String, Resource, u64)> {
    let Some(hard) = quota.pointer("/spec/hard").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Resource, u64)> = hard
        .iter()
        .filter_map(|(key, value)| {
            let r = resource(key)?;
            let v = quantity(value)?;
            let units = match r {
                Resource::Cpu => (v * 1000.0).floor(),
                _ => v.floor(),
            };
            Some((key.clone(), r, units.max(0.0) as u64))
        })
        .collect();
    out.sort();
    out
}

fn format(r: Resource, units: u64) -> String {
    match r {
        Resource::Cpu if units.is_multiple_of(1000) => (units / 1000).to_string(),
        Resource::Cpu => format!("{units}m"),
        _ => units.to_string(),
    }
}

/// The usage of `pods`, by resource.
pub(crate) fn usage<'a>(pods: impl Iterator<Item = &'a Value>) -> [u64; 3] {
    pods.map(pod_usage).fold([0, 0, 0], |acc, u| {
        [acc[0] + u[0], acc[1] + u[1], acc[2] + u[2]]
    })
}

/// `quota` with its status as the controller keeps it: `hard` from `spec.hard` (every
/// key), `used` for the keys counted here.
pub(crate) fn with_status(mut quota: Value, used: [u64; 3]) -> Value {
    let hard = quota
        .pointer("/spec/hard")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let mut used_map = Map::new();
    for (key, r, _) in hard_of(&quota) {
        used_map.insert(key, Value::String(format(r, used[index(r)])));
    }
    quota["status"] = json!({"hard": hard, "used": used_map});
    quota
}

/// The quota admission of a new pod `name` under `quotas` (as stored, with `used` the
/// usage of the namespace's pods now): the first quota it would exceed refuses it.
pub(crate) fn admit(
    name: &str,
    pod: &Value,
    quotas: &[&Value],
    used: [u64; 3],
) -> Result<(), ApiError> {
    let asked = pod_usage(pod);
    for quota in quotas {
        let mut requested = Vec::new();
        let mut was = Vec::new();
        let mut limited = Vec::new();
        for (key, r, hard) in hard_of(quota) {
            let i = index(r);
            if asked[i] == 0 {
                continue;
            }
            if used[i] + asked[i] > hard {
                requested.push(format!("{key}={}", format(r, asked[i])));
                was.push(format!("{key}={}", format(r, used[i])));
                limited.push(format!("{key}={}", format(r, hard)));
            }
        }
        if !requested.is_empty() {
            let quota_name = quota
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            return Err(ApiError::forbidden(
                "pods",
                "",
                name,
                format!(
                    "exceeded quota: {quota_name}, requested: {}, used: {}, limited: {}",
                    requested.join(","),
                    was.join(","),
                    limited.join(",")
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu: &str, memory: &str) -> Value {
        json!({"spec": {"containers": [{"name": "a", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}})
    }

    fn quota(hard: Value) -> Value {
        json!({"metadata": {"name": "compute"}, "spec": {"hard": hard}})
    }

    #[test]
    fn a_pod_past_the_quota_is_refused_naming_only_what_it_exceeds() {
        let q = quota(json!({"pods": "20", "requests.cpu": "100"}));
        let err = admit("p-1", &pod("1", "1Gi"), &[&q], [20, 20_000, 0]).unwrap_err();
        assert_eq!(err.code, 403);
        assert!(
            err.message.ends_with(
                "pods \"p-1\" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=20, limited: pods=20"
            ),
            "{}",
            err.message
        );
        assert!(admit("p-1", &pod("1", "1Gi"), &[&q], [19, 20_000, 0]).is_ok());
        let err = admit("p-2", &pod("1500m", "1Gi"), &[&q], [1, 99_000, 0]).unwrap_err();
        assert!(
            err.message.contains(
                "requested: requests.cpu=1500m, used: requests.cpu=99, limited: requests.cpu=100"
            ),
            "{}",
            err.message
        );
    }

    #[test]
    fn status_counts_live_pods_and_their_requests() {
        let pods = [
            pod("500m", "1Gi"),
            pod("1", "512Mi"),
            json!({"spec": {"containers": []}, "status": {"phase": "Failed"}}),
        ];
        let used = usage(pods.iter());
        assert_eq!(used, [2, 1500, (1 << 30) + (512 << 20)]);
        let q = with_status(
            quota(json!({"pods": "10", "requests.memory": "8Gi", "services": "3"})),
            used,
        );
        assert_eq!(
            q["status"]["used"],
            json!({"pods": "2", "requests.memory": "1610612736"})
        );
        assert_eq!(q["status"]["hard"]["services"], "3");
    }
}
