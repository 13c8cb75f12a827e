/* pyjson.h -- fixture: a header that exists, so <protocol/pyjson.h> is one of ours. */
