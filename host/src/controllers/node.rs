//! In progress: see controllers/mod.rs for the list of controllers.
