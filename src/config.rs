//! Layered configuration: defaults < file < environment. (Being built: issue 4.)
