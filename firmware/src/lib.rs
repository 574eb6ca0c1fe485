//! gearsim-firmware (under construction).
