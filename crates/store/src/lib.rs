//! Saga store.
