/* worker.h -- fixture: the header beside worker.c. */
