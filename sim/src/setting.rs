//! One changed value of a chip configuration, `section.key=value`, for sensitivity runs: the
//! key must already be in the configuration and the value must have its type, so a typo or a
//! wrong unit is an error naming the key instead of a silently unchanged run.

use crate::config::{ChipConfig, ConfigError};

/// `section.key=value`: a key of the configuration's TOML and its new value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// Dotted path of the key (`scheduler.kernel_launch_ns`), two parts or more.
    key: String,
    /// The value as written (`2000`, `true`, `1.5`), not empty.
    value: String,
}

impl Setting {
    /// Parses `section.key=value`.
    pub fn parse(text: &str) -> Result<Setting, ConfigError> {
        let (key, value) = text.split_once('=').ok_or_else(|| ConfigError::Setting {
            setting: text.to_string(),
            message: "expected section.key=value".into(),
        })?;
        Setting::new(key, value)
    }

    /// A key and its value given apart (as a Python dict gives them), checked as
    /// [`Setting::parse`] checks them.
    pub fn new(key: &str, value: &str) -> Result<Setting, ConfigError> {
        let (key, value) = (key.trim(), value.trim());
        let bad = |message: String| ConfigError::Setting {
            setting: format!("{key}={value}"),
            message,
        };
        if key.split('.').count() < 2 || key.split('.').any(str::is_empty) {
            return Err(bad(format!(
                "expected a dotted key such as scheduler.kernel_launch_ns, got `{key}`"
            )));
        }
        if value.is_empty() {
            return Err(bad(format!("`{key}` has no value")));
        }
        Ok(Setting {
            key: key.to_string(),
            value: value.to_string(),
        })
    }

    /// `a=1, b=2`: settings as notes and errors name them.
    pub fn list(settings: &[Setting]) -> String {
        let all: Vec<String> = settings.iter().map(Setting::to_string).collect();
        all.join(", ")
    }

    /// Puts this value in place of the key's in `table` (a configuration's TOML).
    fn apply(&self, table: &mut toml::Table) -> Result<(), ConfigError> {
        let bad = |message: String| ConfigError::Setting {
            setting: self.to_string(),
            message,
        };
        let path: Vec<&str> = self.key.split('.').collect();
        let (last, sections) = path.split_last().expect("split gives at least one part");
        let mut here = table;
        for (i, s) in sections.iter().enumerate() {
            let keys = known(here);
            here = match here.get_mut(*s) {
                Some(toml::Value::Table(t)) => t,
                _ => {
                    let section = sections[..=i].join(".");
                    return Err(bad(format!("no section `{section}` (there: {keys})")));
                }
            };
        }
        let keys = known(here);
        let section = sections.join(".");
        let old = here
            .get_mut(*last)
            .ok_or_else(|| bad(format!("no key `{last}` in `{section}` (keys: {keys})")))?;
        *old = match old {
            toml::Value::Integer(_) => toml::Value::Integer(
                self.value
                    .replace('_', "")
                    .parse()
                    .map_err(|_| bad(format!("expected an integer, got `{}`", self.value)))?,
            ),
            toml::Value::Float(_) => toml::Value::Float(
                self.value
                    .replace('_', "")
                    .parse()
                    .map_err(|_| bad(format!("expected a number, got `{}`", self.value)))?,
            ),
            toml::Value::Boolean(_) => toml::Value::Boolean(match self.value.as_str() {
                "true" => true,
                "false" => false,
                v => return Err(bad(format!("expected true or false, got `{v}`"))),
            }),
            toml::Value::String(_) => toml::Value::String(self.value.clone()),
            _ => {
                return Err(bad(format!(
                    "`{}` is a table or a list; only a single value can be set",
                    self.key
                )));
            }
        };
        Ok(())
    }
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

/// The keys of a table, for an error.
fn known(table: &toml::Table) -> String {
    table.keys().cloned().collect::<Vec<_>>().join(", ")
}

impl ChipConfig {
    /// A configuration's TOML with `settings` applied in order, parsed and validated; errors
    /// name `origin` and the setting.
    pub fn from_toml_with(
        text: &str,
        origin: &str,
        settings: &[Setting],
    ) -> Result<ChipConfig, ConfigError> {
        if settings.is_empty() {
            return ChipConfig::from_toml(text, origin);
        }
        let mut table: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    origin: origin.to_string(),
                    message: e.to_string(),
                })?;
        for s in settings {
            s.apply(&mut table)?;
        }
        let changed = toml::to_string(&table).map_err(|e| ConfigError::Parse {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        ChipConfig::from_toml(
            &changed,
            &format!("{origin} with {}", Setting::list(settings)),
        )
    }

    /// A compiled-in preset ([`ChipConfig::preset`]'s names) with `settings` applied.
    pub fn preset_with(name: &str, settings: &[Setting]) -> Result<ChipConfig, ConfigError> {
        let (key, text) = ChipConfig::preset_toml(name)?;
        ChipConfig::from_toml_with(text, key, settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PRESETS;

    fn preset(name: &str) -> &'static str {
        PRESETS.iter().find(|(n, _)| *n == name).unwrap().1
    }

    #[test]
    fn a_setting_changes_that_value_and_nothing_else() {
        for (name, text) in PRESETS {
            let base = ChipConfig::from_toml(text, name).unwrap();
            let set = [
                Setting::parse("scheduler.kernel_launch_ns=2500").unwrap(),
                Setting::parse("core.clock_mhz = 1_000").unwrap(),
            ];
            let changed = ChipConfig::from_toml_with(text, name, &set).unwrap();
            assert_eq!(changed.scheduler.kernel_launch_ns, 2500, "{name}");
            assert_eq!(changed.core.clock_mhz, 1000, "{name}");
            let mut back = changed.clone();
            back.scheduler.kernel_launch_ns = base.scheduler.kernel_launch_ns;
            back.core.clock_mhz = base.core.clock_mhz;
            assert_eq!(back, base, "{name}: only the two values may change");
        }
    }

    #[test]
    fn a_setting_keeps_the_validation() {
        let text = preset("ascend310p");
        let set = [Setting::parse("core.count=0").unwrap()];
        let e = ChipConfig::from_toml_with(text, "ascend310p", &set).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("core.count") && msg.contains("1..=4096"),
            "{msg}"
        );
        assert!(msg.contains("ascend310p with core.count=0"), "{msg}");
    }

    #[test]
    fn bad_settings_name_the_key_and_what_was_expected() {
        let text = preset("ascend310p");
        let cases = [
            (
                "scheduler.kernel_launch=2000",
                "no key `kernel_launch` in `scheduler`",
            ),
            ("schedule.kernel_launch_ns=2000", "no section `schedule`"),
            (
                "scheduler.kernel_launch_ns=2us",
                "expected an integer, got `2us`",
            ),
            (
                "memory.l2_write_back=yes",
                "expected true or false, got `yes`",
            ),
            ("scheduler=3", "expected a dotted key"),
            ("scheduler.kernel_launch_ns", "expected section.key=value"),
            ("scheduler.kernel_launch_ns=", "has no value"),
        ];
        for (s, want) in cases {
            let e = Setting::parse(s)
                .and_then(|set| ChipConfig::from_toml_with(text, "ascend310p", &[set]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{s}: {e}");
            assert!(e.contains(s.split('=').next().unwrap()), "{s}: {e}");
        }
    }
}
