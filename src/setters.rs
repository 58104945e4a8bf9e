//! [`setters!`]: the builders' setters that store their argument, written as one line
//! each.

/// Writes builder setters that store their argument (or a value made from it) in a field
/// and return the builder: each `name(arg: Type) => field.path;` (or, from the
/// arguments, `=> field.path = expression;`) after its doc comment becomes
/// `pub fn name(mut self, arg: Type) -> Self`.
///
/// ```text
/// setters! {
///     /// The layer's name in metrics and events (default `tollgate`).
///     label(label: &str) => settings.label = label.into();
/// }
/// ```
macro_rules! setters {
    ($($(#[$meta:meta])* $name:ident($($arg:ident: $ty:ty),+) => $($field:ident).+ $(= $value:expr)?;)+) => {
        $(
            $(#[$meta])*
            pub fn $name(mut self, $($arg: $ty),+) -> Self {
                self.$($field).+ = $crate::setters::setters!(@value $($arg),+ $(; $value)?);
                self
            }
        )+
    };
    (@value $arg:ident) => {
        $arg
    };
    (@value $($arg:ident),+; $value:expr) => {
        $value
    };
}
pub(crate) use setters;
