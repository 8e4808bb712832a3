//! Registering the configs: `loadmodule` arguments, redis.conf `flock.*` lines and CONFIG
//! SET, all validated by flock-core's `settings`; their live values are in `server/config.rs`.
//!
//! The configs are registered from `init` with the load arguments as their defaults, then
//! `RM_LoadConfigs` applies redis.conf's `flock.*` lines on top (Redis's own order for module
//! configs; CONFIG REWRITE writes those lines, so the last value an operator set survives a
//! restart). Where such a line overrides a load argument the module says so in the log.

use crate::ffi::{self, Ctx};
use crate::server::config::{same, value_of};
use flock_core::settings;
use redis_module::configuration::{register_i64_configuration, ConfigurationFlags};
use redis_module::{Context, RedisString};

/// Validate the load arguments, register every config with them as defaults and load
/// redis.conf's `flock.*` lines. An error (the text names the argument and the allowed range)
/// means the module must refuse to load.
pub fn init(ctx: Ctx<'_>, load: &Context, args: &[RedisString]) -> Result<(), String> {
    let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    let given = settings::parse_load_args(&bytes)?;
    for setting in settings::ALL {
        let Some(value) = value_of(setting) else {
            return Err(format!("flock.{} has no storage", setting.name));
        };
        let default = given
            .iter()
            .find(|(s, _)| same(s, setting))
            .map_or(setting.default, |(_, v)| *v);
        value.set_default(default);
        register_i64_configuration(
            load,
            setting.name,
            value,
            default,
            setting.min,
            setting.max,
            ConfigurationFlags::DEFAULT,
            None,
        );
    }
    if !ffi::load_configs(ctx) {
        return Err("a flock.* line in the configuration file was refused".to_string());
    }
    for (setting, arg) in given {
        if let Some(value) = value_of(setting) {
            let in_effect = value.get();
            if in_effect != arg {
                load.log_warning(&format!(
                    "the configuration file sets flock.{} {in_effect}, which takes \
                     precedence over the loadmodule argument {} {arg}",
                    setting.name, setting.name
                ));
            }
        }
    }
    Ok(())
}
