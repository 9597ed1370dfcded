//! placeholder: `RunsService` (being written). The constructor below is fixed; the rest is not.

use storage::{Clock, Generation, StorageHandle};

use crate::registry::Registry;

#[derive(Clone)]
pub struct RunsService {
    pub registry: Registry,
    pub storage: StorageHandle,
    pub gen: Generation,
    pub clock: std::sync::Arc<dyn Clock>,
}

impl RunsService {
    pub fn new(registry: Registry, storage: StorageHandle, gen: Generation, clock: std::sync::Arc<dyn Clock>) -> Self {
        RunsService { registry, storage, gen, clock }
    }
}
