"""The hook core, inside the user's process: follows every module call and hands immutable
records to observers. Imports torch; knows nothing of files, statistics or findings."""
