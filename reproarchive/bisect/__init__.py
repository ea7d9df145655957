"""Finding the culprit of a failure an archive holds: which compiler stage (``compiler``) and
which torch build (``environments``). Each replay runs in a child process, so a crash is a
verdict and no bisection state is left in the caller."""
