//! gearsim-host (under construction).
