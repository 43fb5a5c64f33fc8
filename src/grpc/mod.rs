//! The tonic service: validates requests at the edge ([`validate`]), takes every call for
//! one application through one path ([`service`]), calls the application registry from
//! handlers that hold only their own logic ([`handlers`]), maps errors in one place
//! ([`error`]). No allocation logic lives here.
pub mod codec;
pub mod connections;
pub mod error;
pub mod forward;
mod handlers;
pub mod limits;
mod messages;
pub mod observe;
pub mod server;
mod service;
pub mod tls;
pub mod validate;

pub use error::to_status;
pub use handlers::ExecutorEventStream;
pub use server::{ServeError, ServeSettings, serve};
pub use service::AllocatorService;
pub use validate::StartDefaults;
