"""A tracing session: ``hooktrace.trace`` in code, ``hooktrace run`` on a script, and the
assembly of the hook core with its observers. Imports torch, all but ``target``, which checks
what ``run`` runs before torch is imported."""
