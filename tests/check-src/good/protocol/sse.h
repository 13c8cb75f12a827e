/* sse.h -- fixture: a header that exists, so <protocol/sse.h> is one of ours. */
