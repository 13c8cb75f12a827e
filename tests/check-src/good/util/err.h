/* err.h -- fixture: a header that exists, so <util/err.h> is one of ours. */
