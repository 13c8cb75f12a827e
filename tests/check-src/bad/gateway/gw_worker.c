/* gw_worker.c -- fixture: gateway/ reaches into worker/ (rule "worker"). */
#include "gw_local.h"
#include "worker/progress.h"
