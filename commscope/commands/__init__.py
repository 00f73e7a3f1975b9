"""One module per ``commscope`` verb: ``add_arguments(parser)`` and ``main(args) -> int``."""
