"""A plugin whose import fails: a World given it must report a WorldStartError."""

raise RuntimeError("bad_plugin refuses to load: marker-9931")
