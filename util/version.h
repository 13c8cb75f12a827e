/* version.h -- celeriac's version, the one copy: the start-up banner, the
 * sw_ver of worker events and inspect replies, and the worker_info metric. */
#ifndef CR_VERSION_H
#define CR_VERSION_H

#define CELERIAC_VERSION "0.1.0"

#endif
