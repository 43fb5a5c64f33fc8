//! The tonic service: validates requests at the edge, maps errors in one place. (Being built: issue 4.)
