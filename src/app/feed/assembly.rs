//! A full state being put together from a LIST while the watch goes on.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::event::{EventKind, ExecutorView};

/// A full state being put together for the streams waiting for one.
#[derive(Debug, Default)]
pub(super) struct Assembly {
    /// The actor is to run the LIST (it learns so from [`Feed::take_listing_request`]).
    pub(super) wanted: bool,
    /// The ticket of the LIST asked for and not answered yet (an answer with another is
    /// stale: asked for before this full state began, or superseded).
    pub(super) asked: Option<u64>,
    /// The LIST was answered (`listed` and `behind` hold its outcome).
    pub(super) answered: bool,
    /// The pods changed since the LIST was wanted, as their last event shows them.
    pub(super) fresh: HashMap<Box<str>, Arc<ExecutorView>>,
    /// The JSON of the pods the LIST showed at the feed's version (and not changed since).
    pub(super) listed: HashMap<Box<str>, Arc<str>>,
    /// Pods the LIST showed at another version than the feed, or not at all: the LIST
    /// ran ahead of the watch, whose event for each is awaited.
    pub(super) behind: HashSet<Box<str>>,
}

impl Assembly {
    pub(super) fn wanted() -> Self {
        Self {
            wanted: true,
            ..Self::default()
        }
    }

    /// A change published while the full state is put together.
    pub(super) fn changed(&mut self, kind: EventKind, view: &Arc<ExecutorView>) {
        let name = view.executor.pod_name.as_str();
        self.behind.remove(name);
        self.listed.remove(name);
        match kind {
            EventKind::Deleted => {
                self.fresh.remove(name);
            }
            _ => {
                self.fresh.insert(name.into(), Arc::clone(view));
            }
        }
    }
}
