//! The simulated Kubernetes cluster: a real HTTP server speaking the Kubernetes API,
//! with a scheduler/kubelet and fault injection. (Being built: issue 2.)
