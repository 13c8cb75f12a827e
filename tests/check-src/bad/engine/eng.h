/* eng.h -- fixture: a header counts as much as a source file. */
#include "llm/llm_client.h"
