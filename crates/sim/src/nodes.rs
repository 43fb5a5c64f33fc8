//! The simulated nodes: their names, and the Node objects their kubelets register.

use serde_json::{Value, json};

/// Name of simulated node `i`.
pub fn node_name(i: usize) -> String {
    format!("sim-node-{i}")
}

/// Node `i` as its kubelet registers it: Ready, with room for `pods_per_node` pods. CPU and
/// memory are nominal (the simulated scheduler counts pods only).
pub(crate) fn node_object(i: usize, pods_per_node: u32, now: &str) -> Value {
    let name = node_name(i);
    let resources = json!({"pods": pods_per_node.to_string(), "cpu": "64", "memory": "256Gi"});
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }],
            "addresses": [
                {"type": "InternalIP", "address": format!("10.255.{}.{}", i / 256, i % 256)},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "sim://1",
                "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "v1.33.0-sim",
                "machineID": "", "operatingSystem": "linux", "osImage": "simulated",
                "systemUUID": "",
            },
        },
    })
}

/// `i` of a node named by [`node_name`]; `None` for any other node.
pub(crate) fn node_index(name: &str) -> Option<usize> {
    name.strip_prefix("sim-node-")?.parse().ok()
}
