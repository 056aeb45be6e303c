"""``effects``: the command line, a thin layer over the public API and the apps. The one room that
may import every other."""
