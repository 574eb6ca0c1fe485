//! gearsim-sim (under construction).
