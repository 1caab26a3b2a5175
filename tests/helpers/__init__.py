"""What the tests share: faulty allocators (``broken_allocators``,
``oracle_faults``), degenerate hashes, a snapshot of an impl allocator's
state, the planted CrossHair counterexample, a recursion limit lowered
for a block (``recursion``) and a counter of lines of code (``code_lines``).  Imported as
``helpers.NAME`` (pytest puts tests/ on ``sys.path``); a subprocess names
them the same way with tests/ on ``PYTHONPATH``
(``--target helpers.oracle_faults:FreesToTheRight``)."""
