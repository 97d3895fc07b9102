"""The command line: the ``mnist2db`` click group (:mod:`.app`) and its command modules; options are declared once (:mod:`.options`)."""
