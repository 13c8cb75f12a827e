/* net_worker.c -- fixture: net/ reads the worker's config (rule "worker"). */
#include "worker/config.h"
