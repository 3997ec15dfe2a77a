//! `--config FILE` for the binaries: a TOML file with a key per flag, under the flags.

/// Moves each listed key of a parsed config file (`$file`, whose fields are `Option`s) into the
/// field of the same name of the parsed flags (`$args`), unless `$given(name)` says that flag was
/// given on the command line or in the environment (those win over the file). `value:` fields
/// of `$args` are plain values, `optional:` fields are `Option`s themselves.
#[macro_export]
macro_rules! take_settings {
    ($args:expr, $file:expr, $given:expr; value: $($key:ident),* ; optional: $($opt:ident),* $(,)?) => {
        $(
            if !$given(stringify!($key))
                && let Some(v) = $file.$key
            {
                $args.$key = v;
            }
        )*
        $(
            if !$given(stringify!($opt)) && $file.$opt.is_some() {
                $args.$opt = $file.$opt;
            }
        )*
    };
}
