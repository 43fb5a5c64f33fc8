//! Everything that talks to Kubernetes: shared pod watches per namespace, the periodic
//! resync, and executor pod creates and deletes. (Being built: issue 4.)
