"""The Textual app. Only this package (and the `ui`/`demo` commands, lazily) imports Textual."""
