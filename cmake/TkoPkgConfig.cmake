# SPDX-License-Identifier: MIT
# tko_install_pkgconfig(<name>): installs cmake/<name>.pc.in as
# <libdir>/pkgconfig/<name>.pc.
#
# The prefix line is written at install time, for the prefix the install
# really goes to (`cmake --install build --prefix DIR` may differ from the
# configure's CMAKE_INSTALL_PREFIX), as TKO_PKGCONFIG_RELOCATABLE says:
#   OFF: absolute (prefix=/usr). pkg-config and pkgconf recognise the
#        system directories in absolute paths only and drop them from
#        --cflags and --libs (-I/usr/include, -L/usr/lib/<triplet>).
#   ON:  found from the file's own place (prefix=${pcfiledir}/../..,
#        which pkg-config and pkgconf both set), so a prefix moved after
#        install still gives right paths.
#   AUTO (default): OFF for the system prefixes /usr and /usr/local, ON
#        for any other.
# libdir and includedir follow ${prefix}; an absolute CMAKE_INSTALL_LIBDIR
# or CMAKE_INSTALL_INCLUDEDIR is written as it is (and an absolute libdir
# makes the file absolute whatever the option says).
set(TKO_PKGCONFIG_RELOCATABLE AUTO CACHE STRING
    "pkg-config files find their prefix from their own place: ON, OFF, or AUTO (OFF for the prefixes /usr and /usr/local)")
set_property(CACHE TKO_PKGCONFIG_RELOCATABLE PROPERTY STRINGS AUTO ON OFF)
if(NOT TKO_PKGCONFIG_RELOCATABLE MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "TKO_PKGCONFIG_RELOCATABLE must be AUTO, ON or OFF")
endif()

function(tko_install_pkgconfig name)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
    set(relocatable OFF)
    set(TKO_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
    set(up "")
  else()
    set(relocatable ${TKO_PKGCONFIG_RELOCATABLE})
    set(TKO_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
    # From <prefix>/<libdir>/pkgconfig back up to <prefix>: "../.." for "lib".
    file(RELATIVE_PATH up "/tko/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/tko")
    string(REGEX REPLACE "/$" "" up "${up}")
  endif()
  if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
    set(TKO_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
  else()
    set(TKO_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
  endif()
  # Everything but the prefix now; the prefix at install time.
  set(TKO_PC_PREFIX "@TKO_PC_PREFIX@")
  set(template ${CMAKE_CURRENT_BINARY_DIR}/pkgconfig/${name}.pc.in)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/pkgconfig/${name}.pc)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${name}.pc.in ${template} @ONLY)
  install(CODE "
    set(TKO_PC_TEMPLATE \"${template}\")
    set(TKO_PC_OUT \"${out}\")
    set(TKO_PC_RELOCATABLE \"${relocatable}\")
    set(TKO_PC_UP \"${up}\")
    include(\"${PROJECT_SOURCE_DIR}/cmake/TkoPkgConfigPrefix.cmake\")")
  install(FILES ${out} DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()
