//! gearsim-tests (under construction).
