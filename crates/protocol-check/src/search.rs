//! Short, readable discoveries: run the checker until one property has a discovery, then cut
//! the path at the first state that makes it a discovery.
//!
//! stateright keeps overwriting a property's discovery while it finishes the block of states
//! it is working on, so the path it reports can run a few steps past the interesting state
//! (or, for a full run, be one found late and long). The checker is not changed; its path is
//! replayed and trimmed here.

use std::collections::BTreeSet;

use stateright::{Checker, Expectation, HasDiscoveries, Model, Path};

use crate::config::Config;
use crate::model::{Action, ProtocolModel};
use crate::state::State;

/// A discovery, with the size of the search that found it.
#[derive(Debug)]
pub struct Found {
    pub path: Path<State, Action>,
    pub unique_states: usize,
}

/// Runs a strict (single-threaded) BFS until `property` has a discovery; `None` if the whole
/// bounded state space has none.
pub fn first_discovery(config: Config, property: &'static str) -> Option<Found> {
    let checker = ProtocolModel::new(config)
        .checker()
        .threads(1)
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let path = checker.discovery(property)?;
    let path = trim(checker.model(), path, property);
    Some(Found { path, unique_states: checker.unique_state_count() })
}

/// Cuts `path` right after the first state that is a discovery for `property`.
pub fn trim(model: &ProtocolModel, path: Path<State, Action>, property: &'static str) -> Path<State, Action> {
    let wanted = model.property(property);
    let is_discovery = |state: &State| match wanted.expectation {
        Expectation::Sometimes => (wanted.condition)(model, state),
        Expectation::Always | Expectation::Eventually => !(wanted.condition)(model, state),
    };
    let steps = path.clone().into_vec();
    let Some(first) = steps.iter().position(|(state, _)| is_discovery(state)) else { return path };
    let actions: Vec<Action> = steps.iter().take(first).filter_map(|(_, action)| *action).collect();
    let Some(init) = model.init_states().into_iter().next() else { return path };
    Path::from_actions(model, init, &actions).unwrap_or(path)
}
